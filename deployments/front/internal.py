"""The internal HTTP app of an engine replica, for other Baton replicas only.

- `POST /baton/prefill` `{"prompt_token_ids": [...], "cache_salt": "..."}`
  computes the prompt's KV into Mooncake and answers
  `{"prompt_tokens", "cached_tokens", ...}` (actors/openai_app.py PrefillResult)
  once it is saved. With `"first_token": {sampling fields}` the answer is two
  JSON lines: the sampled token `{"token_id", "text", "finish_reason"}` as
  soon as it exists, then the result (or `{"error"}`) once the KV is saved.
  `"lookup": false` (the router's index says the store holds no more of the
  prompt than this engine's cache) skips the engine's store lookup.
- `GET /baton/metrics`: this replica's front metrics, which any front sums
  into the public /metrics;
- everything else goes to vLLM's app behind the Finisher: completions that
  a front forwarded here, already admitted and routed.

It listens on `serve.internal_host`; docs/security.md says what must
firewall it on a cluster.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from common import tracing
from common.constants import ENGINE_DEAD_RETRY_S, ENGINE_GONE
from deployments.front import relay

PREFILL_MAX_BODY_BYTES = 64 * 2**20  # prompt token ids of the longest context, with room


def internal_app(engine, finished_app, metrics=None):
    """ASGI app: /baton/prefill on `engine`, /baton/metrics, the rest to `finished_app`."""
    from deployments.api.bodies import read_body
    from deployments.api.bodies import respond
    from deployments.api.schemas import APIError

    async def app(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/baton/metrics":
            return await respond(send, 200, metrics.render() if metrics else b"", content_type=b"text/plain")
        if scope["type"] == "http" and scope["path"] == "/baton/prefill":
            try:
                req = json.loads(await read_body(receive, PREFILL_MAX_BODY_BYTES) or b"{}")
                ids = [int(t) for t in req["prompt_token_ids"]]
            except (ValueError, KeyError, TypeError, APIError) as exc:
                return await respond(send, 400, {"error": f"bad prefill request: {exc}"})
            return await _prefill(engine, ids, req, send)
        # A forwarded request its engine dies with before its answer began (a stream's first event
        # an error) is a 503 `engine_unavailable`, which the front that sent it runs again itself.
        if not await relay.refusing(finished_app, scope, receive, send, relay.engine_died(engine.errored)):
            await respond(send, 503, ENGINE_GONE, {"Retry-After": str(ENGINE_DEAD_RETRY_S)})

    return app


async def _prefill(engine, ids: list[int], req: dict, send) -> None:
    """Runs one prefill and answers it: one JSON object, or with `first_token` two
    lines, the token as soon as it is sampled and then the result."""
    from deployments.api.bodies import respond
    from vllm.exceptions import VLLMClientError

    lines = isinstance(req.get("first_token"), dict)
    started = False

    async def on_token(token: dict) -> None:
        nonlocal started
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-ndjson")]})
        started = True
        await send({"type": "http.response.body", "body": json.dumps(token).encode() + b"\n", "more_body": True})

    ctx = tracing.extract(req.get("trace") or {})
    with tracing.tracer().start_as_current_span("prefill", context=ctx) as span:
        span.set_attribute("baton.request_id", str(req.get("request_id", "")))
        span.set_attribute("baton.replica", engine.replica)
        try:
            result = asdict(await engine.prefill(ids, req.get("cache_salt"), req.get("first_token") if lines else None,
                                                 on_token if lines else None, lookup=req.get("lookup") is not False))
            span.set_attribute("baton.cached_tokens", result["cached_tokens"])
            span.set_attribute("baton.compute_s", result["compute_s"])
        except (ValueError, VLLMClientError) as exc:  # vLLM's checks, e.g. ids beyond the vocabulary
            if not started:
                return await respond(send, 400, {"error": f"bad prefill request: {exc}"})
            result = {"error": f"{type(exc).__name__}: {exc}"}
    if not lines:
        return await respond(send, 200, result)
    if not started:  # no token came out (the engine aborted the request)
        return await respond(send, 500, {"error": "prefill produced no token"})
    await send({"type": "http.response.body", "body": json.dumps(result).encode() + b"\n", "more_body": False})
