"""Moving one answer to the client: from the local app or from another replica.

Both paths hand the client already-rendered bytes: vLLM's app renders the SSE
events once, in the replica that runs the request, and nothing parses them
on the way. The answer goes through an unbounded queue, so the engine side
finishes (and `on_done` releases the request's engine permit) as soon as
generation ends, however slowly the client reads.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Awaitable, Callable

import aiohttp

# Response headers not passed on from an upstream replica.
_HOP = {b"content-length", b"transfer-encoding", b"connection", b"keep-alive", b"date", b"server"}


class Timing:
    """When the answer started and ended, and how many SSE events it had.

    `on_first` runs once, at the answer's first body bytes."""

    def __init__(self, on_first: Callable[[], None] | None = None) -> None:
        self.on_first = on_first
        self.started = time.monotonic()
        self.first_body: float | None = None
        self.ended: float | None = None
        self.events = 0
        self.status = 0

    def body(self, chunk: bytes) -> None:
        if chunk and self.first_body is None:
            self.first_body = time.monotonic()
            if self.on_first is not None:
                self.on_first()
        self.events += chunk.count(b"data: ")


def broken_stream_event(exc: BaseException) -> bytes:
    """An OpenAI-style error event and [DONE], for a stream cut short."""
    err = {"error": {"message": f"engine replica failed mid-stream: {type(exc).__name__}",
                     "type": "server_error", "param": None, "code": "engine_unavailable"}}
    return f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode()


class UpstreamUnavailable(Exception):
    """The other replica failed before the client was sent anything (its first
    token, or its whole answer when not streaming): the request may run elsewhere."""


async def _deliver(queue: asyncio.Queue, send, extra_headers: list) -> None:
    while (message := await queue.get()) is not None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": list(message.get("headers", [])) + extra_headers}
        await send(message)


class HeldStart:
    """Holds a response's start (status and headers) until its first body bytes, so that nothing
    of an answer is sent before them, and none of an answer that `refuse(status, first_bytes)`
    drops whole (`refused` then)."""

    def __init__(self, refuse: Callable[[int, bytes], bool] | None = None) -> None:
        self.refuse, self.start, self.refused = refuse, None, False

    def pass_on(self, message: dict) -> list[dict]:
        """The messages to send now for `message`: none while the start is held or once refused."""
        if self.refused:
            return []
        if message["type"] == "http.response.start":
            self.start = message
            return []
        if self.start is None:
            return [message]
        if message["type"] != "http.response.body":
            start, self.start = self.start, None
            return [start, message]
        chunk = message.get("body", b"")
        if not chunk and message.get("more_body", False):
            return []  # an empty chunk before the first bytes: nothing to send yet
        if self.refuse is not None and self.refuse(self.start["status"], chunk):
            self.refused, self.start = True, None
            return []
        start, self.start = self.start, None
        return [start, message]

    def rest(self) -> list[dict]:
        """What is still held once the answer ended: its start, when it had no body message."""
        start, self.start = self.start, None
        return [start] if start is not None and not self.refused else []


def engine_died(dead: Callable[[], bool]) -> Callable[[int, bytes], bool]:
    """A `refuse` for an answer whose engine died before it began: an error (a 5xx, or a stream
    whose first event is an error) while `dead()`. The engine ran none of it, so another may."""
    def refuse(status: int, first: bytes) -> bool:
        return (status >= 500 or first.startswith((b'data: {"error"', b"event: error"))) and dead()
    return refuse


def engine_gone(status: int, first: bytes) -> bool:
    """A `refuse` for another replica's answer: its engine died before the answer began (the
    503 `engine_unavailable` of actors/openai_app.py and of `refusing` in internal.py)."""
    return status == 503 and b'"engine_unavailable"' in first


async def refusing(app, scope: dict, receive, send, refuse: Callable[[int, bytes], bool]) -> bool:
    """Runs `app` with its response start held until its first body bytes (HeldStart); False, with
    nothing sent, when `refuse` dropped its answer."""
    hold = HeldStart(refuse)

    async def held_send(message: dict) -> None:
        for m in hold.pass_on(message):
            await send(m)

    await app(scope, receive, held_send)
    for m in hold.rest():
        await send(m)
    return not hold.refused


async def run_local(app, scope: dict, body: bytes, receive, send, extra_headers: list,
                    on_done: Callable[[Timing], None], on_first: Callable[[], None] | None = None,
                    refuse: Callable[[int, bytes], bool] | None = None) -> Timing:
    """Runs `app` on `body` in this process and streams its answer to `send`.

    As in `run_remote`, the response's start (status and headers) is held until
    its first body bytes, so a front that dies before them has sent nothing: an
    ingress in front of it (cluster/ingress.py) may run the request elsewhere.
    `on_done` runs when `app` has produced its whole answer (generation ended).
    An answer `refuse` drops at its first bytes (`engine_died`) raises
    UpstreamUnavailable once `app` returned, with nothing sent and `on_done`
    not called: the caller may run the request elsewhere.
    """
    timing = Timing(on_first)
    queue: asyncio.Queue = asyncio.Queue()
    sent = False
    hold = HeldStart(refuse)

    async def first_receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    async def to_queue(message: dict) -> None:
        if message["type"] == "http.response.start":
            timing.status = message["status"]
        for m in hold.pass_on(message):
            if m["type"] == "http.response.body":
                timing.body(m.get("body", b""))
            queue.put_nowait(m)

    delivery = asyncio.create_task(_deliver(queue, send, extra_headers))
    try:
        await app(scope, first_receive, to_queue)
    finally:
        timing.ended = time.monotonic()
        if not hold.refused:
            on_done(timing)
        for m in hold.rest():  # an answer that ended with no body message
            queue.put_nowait(m)
        queue.put_nowait(None)
    await delivery
    if hold.refused:
        raise UpstreamUnavailable("refused: its engine died before the answer began")
    return timing


async def run_remote(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict,
                     send, extra_headers: list, on_done: Callable[[Timing], None],
                     timeout_s: float, on_first: Callable[[], None] | None = None,
                     refuse: Callable[[int, bytes], bool] | None = None) -> Timing:
    """POSTs `body` to another replica and streams its answer to `send`.

    Nothing reaches the client before the upstream's first body bytes (a
    stream's first event comes with its first token), so a replica that dies
    while the request waits in its queue or prefill raises UpstreamUnavailable,
    without calling `on_done`, as one that cannot be reached does: the caller
    may run the request elsewhere. After that, a broken upstream ends the
    stream with an error event. `on_done` runs once the upstream answer ended.
    An answer that `refuse(status, first_bytes)` drops (another site's 429, a
    replica's dead engine: `engine_gone`) is not relayed: it raises
    UpstreamUnavailable too, with nothing sent.
    """
    timing = Timing(on_first)
    queue: asyncio.Queue = asyncio.Queue()
    resp = None
    try:
        resp = await session.post(url, data=body, headers=headers,
                                  timeout=aiohttp.ClientTimeout(total=timeout_s))
        chunk = await resp.content.readany()
        if refuse is not None and refuse(resp.status, chunk):
            raise UpstreamUnavailable(f"refused: {resp.status}")
    except BaseException as exc:
        if resp is not None:
            resp.release()
        if isinstance(exc, (aiohttp.ClientError, OSError, asyncio.TimeoutError)):
            raise UpstreamUnavailable(f"{type(exc).__name__}: {exc}") from exc
        raise
    timing.status = resp.status
    start = {"type": "http.response.start", "status": resp.status,
             "headers": [(k, v) for k, v in resp.raw_headers if k.lower() not in _HOP]}
    delivery = asyncio.create_task(_deliver(queue, send, extra_headers))
    queue.put_nowait(start)
    try:
        while chunk:
            timing.body(chunk)
            queue.put_nowait({"type": "http.response.body", "body": chunk, "more_body": True})
            chunk = await resp.content.readany()
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
        # The replica died mid-answer: end the stream with an error event.
        queue.put_nowait({"type": "http.response.body", "body": broken_stream_event(exc), "more_body": True})
    finally:
        resp.release()
        timing.ended = time.monotonic()
        on_done(timing)
        queue.put_nowait({"type": "http.response.body", "body": b"", "more_body": False})
        queue.put_nowait(None)
    await delivery
    return timing


async def post_json(session: aiohttp.ClientSession, url: str, payload: dict, timeout_s: float,
                    on_first: Callable[[dict], Awaitable[None]] | None = None) -> dict:
    """POSTs JSON to another replica's internal route; raises on any failure.

    An answer of JSON lines (a prefill asked for its first token) has
    `on_first` awaited on its first line; the last line is the result."""
    async with session.post(url, json=payload, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {(await resp.text())[:300]}")
        if resp.content_type != "application/x-ndjson":
            return await resp.json()
        first = json.loads(await resp.content.readline())
        if on_first is not None:
            await on_first(first)
        result = json.loads(await resp.content.readline())
        if "error" in result:
            raise RuntimeError(f"{url}: {result['error']}")
        return result


class EarlyStream:
    """The `send` of a request whose stream the front may begin itself.

    Until `begin`, messages pass through. After it, the answer that follows
    continues the same stream: its response start is dropped, and an error
    answer becomes an OpenAI error event and [DONE]."""

    def __init__(self, send, extra_headers: list):
        self.send, self.extra = send, extra_headers
        self.started = False
        self._status = 200
        self._error: list[bytes] = []

    async def begin(self, events: bytes) -> None:
        """Sends the client the stream's start and its first `events`."""
        await self.send({"type": "http.response.start", "status": 200,
                         "headers": [(b"content-type", b"text/event-stream; charset=utf-8"), *self.extra]})
        self.started = True
        await self.send({"type": "http.response.body", "body": events, "more_body": True})

    async def __call__(self, message: dict) -> None:
        if not self.started:
            return await self.send(message)
        if message["type"] == "http.response.start":
            self._status = message["status"]
            return
        if message["type"] != "http.response.body" or self._status == 200:
            return await self.send(message)
        self._error.append(message.get("body", b""))
        if not message.get("more_body"):
            await self.send({"type": "http.response.body", "body": _error_event(self._status, b"".join(self._error)),
                             "more_body": False})


def _error_event(status: int, raw: bytes) -> bytes:
    """An error answer's body as the event that ends a stream."""
    try:
        err = json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        err = {"message": raw.decode(errors="replace")[:500], "type": "server_error", "param": None, "code": None}
    return f"data: {json.dumps({'error': err})}\n\ndata: [DONE]\n\n".encode()
