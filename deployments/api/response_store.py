"""Stored responses of the Responses API, in Redis, per tenant: what makes
`previous_response_id` work across fronts and replicas.

vLLM keeps stored responses in one process's memory, which no other replica
can read. Baton keeps them in Redis instead, and the front resolves a chain
itself: a request with `previous_response_id` becomes one whose `input` is
the previous turn's input, its output items, then the new input (OpenAI's
rule: the previous `instructions` are not carried over), and the engine sees
a stateless request. A chain keeps one session key (the header's, or one
named after its first response), so its turns go to the replica that holds
their prefix, as a session's do.

Keys: `baton:response:<tenant>:<id>` holds `{"response", "input", "session"}`
as JSON, with the config's TTL (`responses.store_ttl_s`). A conversation
longer than `responses.max_stored_bytes` is answered but not stored. Another
tenant's id is simply not found.
"""

from __future__ import annotations

import asyncio
import json

P = "baton:response:"
# The stream events that carry a finished response: done, or cut at max_output_tokens (still chainable).
FINISHED = (b'"type":"response.completed"', b'"type":"response.incomplete"')
KEPT_STATUSES = ("completed", "incomplete")


def _key(tenant: str, response_id: str) -> str:
    return f"{P}{tenant}:{response_id}"


def input_items(value) -> list:
    """A request's `input` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value or [])


def chained(body: dict, previous: dict) -> None:
    """Makes `body` (a request with `previous_response_id`) stateless: its input becomes the
    stored turn's input, that turn's output items, then its own. Changes `body`."""
    body.pop("previous_response_id", None)
    body["input"] = previous["input"] + list(previous["response"].get("output") or []) + input_items(
        body.get("input"))


class ResponseStore:
    """Stored responses in Redis (see the module docstring); `client` is an asyncio Redis client."""

    def __init__(self, client, ttl_s: int, max_bytes: int):
        self.r, self.ttl_s, self.max_bytes = client, ttl_s, max_bytes

    async def get(self, tenant: str, response_id: str) -> dict | None:
        """The stored `{"response", "input", "session"}` of `tenant`'s `response_id`, or None.
        Changes nothing."""
        raw = await self.r.get(_key(tenant, response_id))
        return json.loads(raw) if raw else None

    async def put(self, tenant: str, response: dict, input_items_: list, session: str) -> bool:
        """Stores a finished response with the input that led to it, for the TTL; False (and
        nothing stored) when the conversation is over the size cap."""
        raw = json.dumps({"response": response, "input": input_items_, "session": session},
                         separators=(",", ":"))
        if len(raw) > self.max_bytes:
            return False
        await self.r.set(_key(tenant, response["id"]), raw, ex=self.ttl_s)
        return True

    async def delete(self, tenant: str, response_id: str) -> bool:
        """Removes `tenant`'s `response_id`; whether it existed."""
        return bool(await self.r.delete(_key(tenant, response_id)))


class ResponseCapture:
    """The `send` of one Responses request: passes everything on, and keeps the final response
    object (a JSON answer's body, or a stream's `response.completed` or `.incomplete` event) in
    `response`.

    With `keep` (a coroutine function of the response), the message that completes the response
    waits for `keep` to store it, for up to `hold_s`, before it reaches the client: a client that
    has a response's id can chain on it at once, from any front. (Stored after the answer, the
    next turn raced the write: a turn got a 404 in a Redis kill at 16 replicas.) Past
    `hold_s` (Redis away) the message goes on and `kept`, the store's task, still runs."""

    def __init__(self, send, keep=None, hold_s: float = 0.0):
        self.send = send
        self.response: dict | None = None
        self.status, self.json, self.parts = 0, False, []
        self.pending = b""  # a stream's bytes after its last complete event
        self.keep, self.hold_s = keep, hold_s
        self.kept: asyncio.Future | None = None

    async def __call__(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            ctype = next((v for k, v in message.get("headers", []) if k == b"content-type"), b"")
            self.json = ctype.startswith(b"application/json")
        elif message["type"] == "http.response.body" and self.status == 200:
            self._see(message.get("body", b""), message.get("more_body", False))
            if self.response is not None and self.keep is not None and self.kept is None:
                self.kept = asyncio.ensure_future(self.keep(self.response))
                await asyncio.wait({self.kept}, timeout=self.hold_s)
        await self.send(message)

    def _see(self, chunk: bytes, more: bool) -> None:
        if self.json:
            self.parts.append(chunk)
            if not more:
                self.response = _loads(b"".join(self.parts))
            return
        events = (self.pending + chunk).split(b"\n\n")
        self.pending = events.pop()
        for event in events:
            if any(marker in event for marker in FINISHED):
                data = next((line[6:] for line in event.split(b"\n") if line.startswith(b"data: ")), b"")
                obj = _loads(data)
                self.response = obj.get("response") if isinstance(obj, dict) else None


def _loads(raw: bytes):
    try:
        return json.loads(raw)
    except ValueError:
        return None
