"""bench/sites/delay_proxy.py: the one-way delay between local sites, and a site that goes away."""

from __future__ import annotations

import socket
import socketserver
import threading
import time

import pytest

from bench.sites.delay_proxy import DelayProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(4096):
            self.request.sendall(data)


@pytest.fixture()
def echo_port():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _round_trip(port: int, payload: bytes) -> tuple[bytes, float]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        t0 = time.monotonic()
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += s.recv(4096)
        return got, time.monotonic() - t0


def test_each_direction_is_delayed_in_order_and_close_drops_the_site(echo_port):
    proxy = DelayProxy(echo_port, delay_s=0.05).start()
    try:
        got, rtt = _round_trip(proxy.port, b"x" * 10000)
        assert got == b"x" * 10000
        assert 0.1 <= rtt < 1.0  # 50 ms each way
    finally:
        proxy.close()
    with pytest.raises(OSError):
        _round_trip(proxy.port, b"gone")
    proxy.start()  # back on the same port: the site rejoins
    try:
        assert _round_trip(proxy.port, b"back")[0] == b"back"
    finally:
        proxy.close()
