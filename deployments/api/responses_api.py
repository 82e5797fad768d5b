"""The Responses API's state in the front: chains and the `/v1/responses/{id}` routes.

A new response gets its id here (vLLM answers with the request's
`request_id`), so its chain's session key is known before it is routed. A
request with `previous_response_id` is made stateless from the tenant's
stored conversation (deployments/api/response_store.py), and is routed with the
chain's session key, so it runs where its prefix is cached. The answer the
client received is stored once it completed, before the client gets the
answer's last message (for up to READ_RETRY_S while Redis is away).
"""

from __future__ import annotations

import logging
import uuid

import redis

from common.redis_retry import retried
from deployments.api.bodies import respond
from deployments.api.response_store import KEPT_STATUSES, ResponseStore, chained
from deployments.api.schemas import APIError

log = logging.getLogger("baton.responses")
KEEP_RETRY_S = 30.0  # how long a finished response waits for Redis to come back before it is given up
# How long a request that reads a stored response (a chain's turn, a GET) waits for Redis to come back:
# `baton up` restarts a dead Redis within a second or two; longer is an outage, answered with a 503.
READ_RETRY_S = 3.0


def _unavailable() -> APIError:
    return APIError(503, "the response store is unavailable; retry", "server_error", code="store_unavailable",
                    headers={"Retry-After": "1"})


class ResponsesAPI:
    """One front's view of the stored responses."""

    def __init__(self, store: ResponseStore, retry_s: float = KEEP_RETRY_S, hold_s: float = READ_RETRY_S):
        self.store, self.retry_s = store, retry_s
        self.hold_s = hold_s  # how long an answer's last message waits for its store (ResponseCapture)
        self.given_up = 0  # finished responses never stored: Redis stayed away longer than retry_s

    async def chain(self, body: dict, tenant: str, session: str | None) -> str:
        """Gives a Responses request its response id and, with `previous_response_id`, the stored
        conversation it continues (404 when `tenant` has no such response). Changes `body`;
        returns the chain's session key (`session`, the header's, wins). A Redis restart costs the
        turn a wait of up to READ_RETRY_S, not an error."""
        body["request_id"] = f"resp_{uuid.uuid4().hex}"
        previous_id = body.get("previous_response_id")
        if previous_id is None:
            return session or f"response:{body['request_id']}"
        try:
            previous = await retried(lambda: self.store.get(tenant, str(previous_id)), READ_RETRY_S)
        except redis.RedisError:
            raise _unavailable() from None
        if previous is None:
            raise APIError(404, f"Previous response with id '{previous_id}' not found.",
                           param="previous_response_id", code="previous_response_not_found")
        chained(body, previous)
        return session or previous["session"]

    async def keep(self, tenant: str, response, turn: list, session: str) -> bool:
        """Stores a finished `response` (as its client received it; one cut at max_output_tokens
        too, as OpenAI keeps those) with the input `turn` that led to it. The answer's last message
        waits for it up to `hold_s`: while Redis is away (a restart) the write is tried again for up
        to `retry_s`, and only then given up (a turn that names it gets a 404). Whether it was stored."""
        if not isinstance(response, dict) or response.get("status") not in KEPT_STATUSES or "id" not in response:
            return False
        response["store"] = True  # the engine's own store is off; Baton's kept it
        try:  # a SET: a second try is harmless
            return await retried(lambda: self.store.put(tenant, response, turn, session), self.retry_s)
        except redis.RedisError as exc:
            self.given_up += 1
            log.warning("response %s not stored: Redis away for %.0f s (%s)", response["id"], self.retry_s,
                        type(exc).__name__)
            return False

    async def stored(self, scope, send, tenant: str) -> None:
        """GET and DELETE /v1/responses/{id}, and POST .../cancel, on `tenant`'s stored responses."""
        response_id, _, action = scope["path"][len("/v1/responses/"):].partition("/")
        method = scope["method"]
        if (action, method) not in (("", "GET"), ("", "DELETE"), ("cancel", "POST")):
            raise APIError(404, f"no route {method} {scope['path']}", code="not_found")
        try:
            stored = await retried(lambda: self.store.get(tenant, response_id), READ_RETRY_S)
            if stored is not None and method == "DELETE":  # a DEL: a second try is harmless
                await retried(lambda: self.store.delete(tenant, response_id), READ_RETRY_S)
        except redis.RedisError:
            raise _unavailable() from None
        if stored is None:
            raise APIError(404, f"Response with id '{response_id}' not found.", code="not_found")
        if action == "cancel":  # only a background response can be; Baton runs none
            raise APIError(400, "Cannot cancel a response that was not created with background=true.",
                           param="response_id", code="not_background")
        if method == "DELETE":
            return await respond(send, 200, {"id": response_id, "object": "response", "deleted": True})
        await respond(send, 200, stored["response"])
