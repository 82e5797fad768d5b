"""The internal HTTP app of an engine replica, for other Baton replicas only.

- `POST /baton/prefill` `{"prompt_token_ids": [...], "cache_salt": "..."}`
  computes the prompt's KV into Mooncake and answers
  `{"prompt_tokens", "cached_tokens", "seconds"}` once it is saved.
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

PREFILL_MAX_BODY_BYTES = 64 * 2**20  # prompt token ids of the longest context, with room


def internal_app(engine, finished_app, metrics=None):
    """ASGI app: /baton/prefill on `engine`, /baton/metrics, the rest to `finished_app`."""
    from deployments.bodies import read_body
    from deployments.front import respond
    from deployments.schemas import APIError
    from vllm.exceptions import VLLMClientError

    async def app(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/baton/metrics":
            return await respond(send, 200, metrics.render() if metrics else b"", content_type=b"text/plain")
        if scope["type"] == "http" and scope["path"] == "/baton/prefill":
            try:
                req = json.loads(await read_body(receive, PREFILL_MAX_BODY_BYTES) or b"{}")
                ids = [int(t) for t in req["prompt_token_ids"]]
            except (ValueError, KeyError, TypeError, APIError) as exc:
                return await respond(send, 400, {"error": f"bad prefill request: {exc}"})
            ctx = tracing.extract(req.get("trace") or {})
            with tracing.tracer().start_as_current_span("prefill", context=ctx) as span:
                span.set_attribute("baton.request_id", str(req.get("request_id", "")))
                span.set_attribute("baton.replica", engine.replica)
                try:
                    result = await engine.prefill(ids, req.get("cache_salt"))
                except (ValueError, VLLMClientError) as exc:  # vLLM's checks, e.g. ids beyond the vocabulary
                    return await respond(send, 400, {"error": f"bad prefill request: {exc}"})
                span.set_attribute("baton.cached_tokens", result.cached_tokens)
            return await respond(send, 200, asdict(result))
        return await finished_app(scope, receive, send)

    return app
