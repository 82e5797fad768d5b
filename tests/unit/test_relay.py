"""relay.run_remote against a real HTTP peer that dies at chosen points: before
the answer's first body bytes the caller may retry (UpstreamUnavailable, the
client was sent nothing); after them the stream ends with an error event."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from common.processes import free_ports
from deployments.front import relay

pytestmark = pytest.mark.timeout(20)

HEADERS = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
EVENT = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _relay(answer: bytes | None):
    """Runs run_remote against a peer that reads the request, writes `answer`
    and closes the connection (None: nothing listens). Returns (raised, what
    reached the client, the on_done timings)."""
    async def peer(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        writer.write(answer)
        await writer.drain()
        writer.close()

    port = free_ports(1)[0]
    server = await asyncio.start_server(peer, "127.0.0.1", port) if answer is not None else None
    sent, done = [], []

    async def send(message):
        sent.append(message)

    async with aiohttp.ClientSession() as session:
        try:
            await relay.run_remote(session, f"http://127.0.0.1:{port}/v1/chat/completions", b"{}",
                                   {"content-type": "application/json"}, send, [(b"x-extra", b"1")],
                                   done.append, 10)
            raised = None
        except relay.UpstreamUnavailable as exc:
            raised = exc
        finally:
            if server is not None:
                server.close()
    return raised, sent, done


def test_a_peer_that_cannot_be_reached_may_be_retried():
    raised, sent, done = asyncio.run(_relay(None))
    assert str(raised).startswith("ClientConnectorError") and sent == [] and done == []


def test_a_peer_that_dies_after_its_headers_but_before_a_token_may_be_retried():
    raised, sent, done = asyncio.run(_relay(HEADERS))
    assert raised is not None and sent == [] and done == []


def test_a_peer_that_dies_after_its_first_token_ends_the_stream_with_an_error_event():
    raised, sent, done = asyncio.run(_relay(HEADERS + _chunk(EVENT)))
    assert raised is None
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert (b"x-extra", b"1") in sent[0]["headers"]
    bodies = [m["body"] for m in sent[1:]]
    assert bodies[0] == EVENT and bodies[-1] == b"" and not sent[-1]["more_body"]
    error, end = bodies[1].decode().strip().split("\n\n")
    assert json.loads(error.removeprefix("data: "))["error"]["code"] == "engine_unavailable"
    assert end == "data: [DONE]"
    assert len(done) == 1 and done[0].status == 200 and done[0].events == 1


def test_a_whole_answer_passes_through():
    raised, sent, done = asyncio.run(_relay(HEADERS + _chunk(EVENT) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"))
    assert raised is None
    assert b"".join(m.get("body", b"") for m in sent[1:]) == EVENT + b"data: [DONE]\n\n"
    assert len(done) == 1 and done[0].events == 2


def test_a_local_answer_sends_its_headers_with_its_first_bytes_not_before():
    """run_local holds the start as run_remote does: until the engine's first bytes, the
    client (or an ingress that may retry elsewhere) has been sent nothing."""
    first = asyncio.Event()
    sent: list[tuple[str, bool]] = []

    async def app(scope, receive, send):
        assert (await receive())["body"] == b"{}"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": True})
        await first.wait()
        await send({"type": "http.response.body", "body": EVENT, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def send(message):
        sent.append((message["type"], first.is_set()))

    async def main():
        task = asyncio.create_task(relay.run_local(app, {}, b"{}", None, send, [("x-a", "b")], lambda t: None))
        await asyncio.sleep(0.05)
        assert sent == []  # the start waits for the first bytes
        first.set()
        timing = await task
        assert timing.status == 200 and timing.first_body is not None

    asyncio.run(main())
    assert sent == [("http.response.start", True), ("http.response.body", True), ("http.response.body", True)]
