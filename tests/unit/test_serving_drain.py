"""`serving.drain`: a stopping replica's HTTP servers let the requests they run finish, within a bound.

Real uvicorn (`serve_asgi`) on a loop thread of its own, as a replica runs its front, and a
real HTTP client in another thread; the app answers after `delay` seconds.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from deployments.serving import drain, listen_socket, serve_asgi

pytestmark = pytest.mark.quiet  # a request must reach the server within its sleep: a quiet machine (Makefile)


def _slow_app(delay_s: float):
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await asyncio.sleep(delay_s)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"done"})
    return app


@pytest.fixture
def loop_thread():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def _serve(loop, delay_s: float):
    sock = listen_socket("127.0.0.1", 0, reuse_port=False)
    port = sock.getsockname()[1]

    async def start():
        return serve_asgi(_slow_app(delay_s), sock)
    server, task = asyncio.run_coroutine_threadsafe(start(), loop).result(5)
    deadline = time.monotonic() + 5
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    return server, task, f"http://127.0.0.1:{port}/"


def _request_in_background(url: str) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def go():
        try:
            r = httpx.get(url, timeout=10)
            out["status"], out["body"] = r.status_code, r.text
        except httpx.HTTPError as e:
            out["error"] = repr(e)
    t = threading.Thread(target=go)
    t.start()
    return t, out


def test_a_request_in_flight_is_answered_before_drain_returns(loop_thread):
    server, task, url = _serve(loop_thread, delay_s=0.5)
    t, out = _request_in_background(url)
    time.sleep(0.2)  # the request is running
    started = time.monotonic()
    assert drain([server], [task], timeout_s=5) is True
    assert time.monotonic() - started >= 0.2  # it waited for the request
    t.join(5)
    assert out == {"status": 200, "body": "done"}
    with pytest.raises(httpx.ConnectError):  # the listener is closed: nothing new gets in
        httpx.get(url, timeout=2)


def test_drain_gives_up_after_its_bound(loop_thread):
    server, task, url = _serve(loop_thread, delay_s=3)
    t, _ = _request_in_background(url)
    time.sleep(0.2)
    started = time.monotonic()
    assert drain([server], [task], timeout_s=0.3) is False
    assert time.monotonic() - started < 1.5
    server.force_exit = True
    t.join(10)


def test_idle_servers_stop_at_once(loop_thread):
    server, task, _ = _serve(loop_thread, delay_s=0)
    started = time.monotonic()
    assert drain([server], [task], timeout_s=5) is True
    assert time.monotonic() - started < 1.0  # uvicorn's tick is 0.1 s
