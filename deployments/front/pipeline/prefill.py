"""Stage 6, prefill: the prompt computed on the prefill replica, its KV saved into Mooncake.

Only a disaggregated route has this stage. A prefill that fails costs nothing
but time: decode computes the prompt. A chat stream may take its first token
from the prefill engine (deployments/front/first_token.py): the front then
begins the stream itself and decode continues after that token.
"""

from __future__ import annotations

from common import tracing
from deployments.front import first_token, relay
from deployments.front.pipeline.request import Request


class Prefill:
    """Runs a routed request's prompt on its prefill replica (`placement` ends its prefill part)."""

    def __init__(self, cfg, http, model: str, placement) -> None:
        self.cfg, self.http, self.model, self.placement = cfg, http, model, placement

    async def __call__(self, req: Request) -> None:
        """Runs the prefill when the route has one; sets `req.info`'s prefill fields, or
        `decode_only` when decode must compute the prompt, and `req.store_lookup` off when the
        prefill's saves did not drain. May begin `req.stream` and set `req.first_token`."""
        route, info = req.route, req.info
        if route is None or route.decode_only:
            return
        if not route.prefill_url:  # a registry entry without a URL: decode computes the prompt
            info.decode_only = True
            return
        lead = self.cfg.routing.prefill_first_token and first_token.eligible(req.kind, req.body)
        payload = {"prompt_token_ids": req.ids, "cache_salt": req.tenant, "request_id": req.request_id,
                   "lookup": route.prefill_lookup, "trace": tracing.inject()}
        if lead:
            payload["first_token"] = first_token.sampling(req.body)

        async def on_first(token: dict) -> None:
            if first_token.usable(token):
                req.first_token = token["token_id"]
                info.first_token = "prefill"
                await req.stream.begin(first_token.first_events(req.request_id, self.model, token["text"]))

        try:
            res = await relay.post_json(self.http, f"{route.prefill_url}/baton/prefill", payload,
                                        self.cfg.serve.request_timeout_s, on_first if lead else None)
            info.prefill_cached_tokens = int(res["cached_tokens"])
            info.prefill_replica = route.prefill_replica
            # Its saves did not drain in time (a stopped or lagging store, actors/save_watch.py
            # DrainBudget): decode recomputes the prompt rather than wait on the store's loads.
            req.store_lookup = res.get("drain_end") != "timeout"
        except Exception as exc:  # noqa: BLE001 - decode recomputes the prompt
            info.retried_after = f"prefill {type(exc).__name__}"
            info.decode_only = True
        finally:
            self.placement.prefill_done(route)
