"""HAProxy in front of the fronts (cluster/ingress.py): what it retries when a front dies.

The fronts here are two small HTTP servers sharing one loopback port with
SO_REUSEPORT, as the replicas' fronts do: one answers with its PID, the other
exits (as a SIGKILLed replica would) when a request reaches it, before any byte
of an answer. HAProxy is the real one `baton up` runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from cluster import ingress
from common.config import load_config
from common.processes import free_ports, port_open

FRONT = r"""
import os, socket, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
dies = sys.argv[2] == "dies"
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if dies:
            os._exit(1)
        if sys.argv[2] == "streams":  # an event now, the next 0.5 s later, as a slow decode would
            self.send_response(200); self.send_header("Transfer-Encoding", "chunked"); self.end_headers()
            for event in (b"data: 1\n\n", b"data: 2\n\n"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event)); self.wfile.flush(); time.sleep(0.5)
            self.wfile.write(b"0\r\n\r\n"); self.wfile.flush()
            return
        body = str(os.getpid()).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST
    def log_message(self, *a): pass
class S(ThreadingHTTPServer):
    daemon_threads = True
    def server_bind(self):
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1); super().server_bind()
S(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.fixture
def proxy(tmp_path):
    port, front_port = free_ports(2)
    p, = ingress.haproxy_processes("127.0.0.1", port, front_port, 60, tmp_path, tmp_path, n=1)
    p.start()
    fronts: list[subprocess.Popen] = []

    def front(mode: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", FRONT, str(front_port), mode])
        fronts.append(proc)
        deadline = time.monotonic() + 10
        while not port_open("127.0.0.1", front_port) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # the second server's socket joins the port's group
        return proc

    try:
        p.wait_ready(10)
        yield f"http://127.0.0.1:{port}", front
    finally:
        for proc in fronts:
            proc.kill()
            proc.wait()
        p.stop()


def _through_a_dying_front(url: str, front, path: str, body: dict) -> list[int]:
    """Statuses of requests sent, each on a new connection, while a front that dies on its first
    request shares the port with one that answers, until it has died (three times over)."""
    statuses = []
    for _ in range(3):
        dying = front("dies")
        for _ in range(40):  # the kernel hands each new connection to either front
            statuses.append(httpx.post(url + path, json=body, timeout=10).status_code)
            if dying.poll() is not None:
                break
        assert dying.wait(5) == 1  # it got a request, and died with it
    return statuses


def test_no_front_listening_is_an_openai_style_503(proxy):
    url, _ = proxy
    r = httpx.post(url + "/v1/chat/completions", json={})
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert r.json()["error"]["code"] == "engine_unavailable"


def test_a_generation_request_whose_front_dies_before_a_byte_runs_on_another(proxy):
    url, front = proxy
    survivor = front("answers")
    for body in ({"messages": "hi"}, {"messages": "x" * 200_000}):  # both fit the retry buffer
        assert set(_through_a_dying_front(url, front, "/v1/chat/completions", body)) == {200}
    r = httpx.post(url + "/v1/messages", json={})
    assert r.status_code == 200 and r.text == str(survivor.pid)


def test_a_body_past_the_retry_buffer_and_other_posts_are_not_run_twice(proxy):
    url, front = proxy
    front("answers")
    big = {"messages": "x" * ingress.RETRY_BODY_BYTES}
    for path, body in (("/v1/chat/completions", big), ("/v1/batches", {"input_file_id": "f"})):
        statuses = _through_a_dying_front(url, front, path, body)
        assert statuses.count(502) == 3 and statuses.count(200) == len(statuses) - 3, (path, statuses)
    r = httpx.post(url + "/v1/chat/completions", json={})  # the dying fronts are gone
    assert r.status_code == 200


@pytest.mark.quiet
def test_a_streamed_event_passes_at_once_not_corked(proxy):
    """Each event reaches the client as the front sends it. Without `option http-no-delay`,
    HAProxy corked small writes: the first event came 200 ms late (Linux's cork timer)."""
    url, front = proxy
    front("streams")
    waits = []
    for _ in range(3):
        started = time.monotonic()
        with httpx.stream("POST", url + "/v1/chat/completions", json={"stream": True}, timeout=10) as r:
            first = next(r.iter_raw())
            waits.append(time.monotonic() - started)
            assert first.startswith(b"data: 1")
    assert min(waits) < 0.12, waits


def test_the_502_and_504_bodies_are_openai_errors():
    for status in (502, 503, 504):
        head, body = ingress.error_file(status).split("\r\n\r\n", 1)
        assert head.startswith(f"HTTP/1.1 {status} ")
        assert f"Content-Length: {len(body)}" in head
        error = json.loads(body)["error"]
        assert error["type"] == "server_error" and error["code"]


def test_fronts_bind_loopback_behind_haproxy_and_the_port_is_checked(tmp_path):
    path = tmp_path / "baton.yaml"
    path.write_text("serve: {ingress: haproxy, host: 0.0.0.0, front_port: 18001}\n")
    assert load_config(path, environ={}).serve.front_bind() == ("127.0.0.1", 18001)
    path.write_text("serve: {host: 0.0.0.0, ingress: direct}\n")
    assert load_config(path, environ={}).serve.front_bind() == ("0.0.0.0", 8000)
    assert [ingress.resolve("auto", c) for c in (False, True)] == ["haproxy", "direct"]
    assert ingress.resolve("haproxy", True) == "haproxy" and ingress.resolve("direct", False) == "direct"
    path.write_text("serve: {ingress: haproxy, front_port: 8000}\n")
    with pytest.raises(Exception, match="serve.front_port and serve.port"):
        load_config(path, environ={})


def test_a_cluster_deploy_names_the_field_it_cannot_do(tmp_path, capsys):
    from cluster import deploy

    path = tmp_path / "baton.yaml"
    path.write_text("serve: {ingress: haproxy}\n")
    assert deploy.main(["--config", str(path), "--dry-run"]) == 2
    assert f"serve.ingress in {path}" in capsys.readouterr().err
