"""Reading request bodies within a size limit (refusing larger ones with a 413), and answering.

A refused body is still read (and dropped) up to DRAIN_FACTOR times the
limit, so that the client reads the 413 rather than a connection reset; past
that the connection is closed.
"""

from __future__ import annotations

import json

from actors.finisher import header
from deployments.api.schemas import APIError

DRAIN_FACTOR = 4  # an oversized body is read and dropped up to this many times the limit


async def _drain(receive, size: int, limit: int) -> None:
    """Reads and drops the rest of a refused body, so the client reads the 413
    instead of a reset; stops (and the connection closes) past DRAIN_FACTOR x limit."""
    more = True
    while more and size <= DRAIN_FACTOR * limit:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        more = message.get("more_body", False)


def _too_large(limit: int) -> APIError:
    return APIError(413, f"request body over {limit} bytes (serve.max_body_bytes)", code="request_too_large",
                    headers={"Connection": "close"})


async def check_length(scope, receive, limit: int) -> None:
    """A 413 before anything else when the declared Content-Length is over `limit`."""
    raw = header(scope["headers"], b"content-length")
    if raw.isdigit() and int(raw) > limit:
        await _drain(receive, 0, limit)
        raise _too_large(limit)


async def read_body(receive, limit: int) -> bytes:
    """The whole request body; 413 past `limit` bytes, ConnectionError if the client left."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            chunks.clear()
            if message.get("more_body"):
                await _drain(receive, size, limit)
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def small_body(scope) -> bool:
    """Whether the request declares a body small enough to be read already
    (closing a socket with unread data would reset it before the answer)."""
    raw = header(scope["headers"], b"content-length")
    return raw.isdigit() and int(raw) <= 65536


async def respond(send, status: int, body: dict | bytes, headers: dict | None = None,
                  content_type: bytes = b"application/json") -> None:
    """Sends one whole answer: `body` (JSON unless bytes) with `status` and `headers`."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = [(b"content-type", content_type), (b"content-length", str(len(raw)).encode())]
    hdrs += [(k.lower().encode(), str(v).encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": raw})
