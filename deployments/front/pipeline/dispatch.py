"""Stage 7, dispatch: the engine runs the request, here or on the chosen replica.

Runs decode in this process when the route chose this replica (or none), else
forwards the bytes to the chosen replica's internal server. A request runs
again, once, when it failed before the client was sent anything: the chosen
replica could not be reached or died before its first token (it runs here
then), or this replica's engine died with the request in it (it is placed
again, elsewhere: route.py no longer chooses a dead engine). Either way the
answer's bytes go to the client as the engine rendered them (relay.py).
"""

from __future__ import annotations

import json
from typing import Callable

from actors.finisher import INFO_HEADER, ask_usage, usage_headers
from common import tracing
from common.constants import REQUEST_ID_HEADER, SESSION_HEADER
from deployments.front import relay
from deployments.front.pipeline.request import Request

_REPLACED = frozenset({b"content-length", b"content-type", b"x-request-id", INFO_HEADER})


class Dispatch:
    """Sends each request's engine body to its engine and its answer to the client; `placement`
    is the route strategy (route.py), `dead()` says whether this replica's engine died."""

    def __init__(self, replica: str, http, timeout_s: float, metrics, placement,
                 dead: Callable[[], bool] = lambda: False) -> None:
        self.replica, self.http, self.timeout_s, self.metrics = replica, http, timeout_s, metrics
        self.placement, self.engine_died = placement, relay.engine_died(dead)

    async def __call__(self, req: Request, done) -> None:
        """Runs `req` to its answer; `done(timing)` runs when the engine has produced it (finish.py).
        Changes `req.route` (and its counts) when the request is placed again."""
        # Whose answer it is, for the Finisher's usage counters; chat and completion streams always
        # ask vLLM for usage (Responses and Messages streams report it anyway).
        bill = usage_headers(req.tenant, req.body["model"], req.kind in ("chat", "text") and ask_usage(req.body))
        raw = req.engine_body()  # built once: placing the request again changes no part of it
        for again in (False, True):
            route = req.route
            if route is not None and route.decode_replica != self.replica and route.decode_url:
                try:
                    return await self._remote(req, raw, bill, done)
                except relay.UpstreamUnavailable as exc:
                    req.info.retried_after = str(exc).split(":")[0]
                    self.metrics.retries.inc()
            # A stream the front began (its prefill's first token) is the dead engine's to end.
            refuse = None if again or req.stream.started else self.engine_died
            try:
                return await self._local(req, raw, bill, done, refuse)
            except relay.UpstreamUnavailable:  # the engine died with it, before its answer began
                req.info.retried_after = "EngineDeadError"
                self.metrics.retries.inc()
                self.placement.finished(req.route)
                req.route = None
                await self.placement(req)

    async def _remote(self, req: Request, raw: bytes, bill: list, done) -> None:
        scope, route = req.scope, req.route
        headers = {"content-type": "application/json", INFO_HEADER.decode(): json.dumps(req.info.body()),
                   REQUEST_ID_HEADER: req.request_id, **tracing.inject(),
                   **{k.decode(): v.decode() for k, v in bill}}
        for k, v in scope["headers"]:
            if k in (SESSION_HEADER.encode(), b"authorization"):
                headers[k.decode()] = v.decode()
        await relay.run_remote(self.http, f"{route.decode_url}{scope['path']}", raw, headers, req.stream,
                               req.response_headers, done, self.timeout_s, self.placement.on_first(route),
                               refuse=relay.engine_gone)

    async def _local(self, req: Request, raw: bytes, bill: list, done, refuse) -> None:
        inner = dict(req.scope)
        dropped = _REPLACED.union(k for k, _ in bill)
        inner["headers"] = [(k, v) for k, v in inner["headers"] if k not in dropped]
        inner["headers"] += [(b"content-length", str(len(raw)).encode()),
                             (b"content-type", b"application/json"),
                             (INFO_HEADER, json.dumps(req.info.body()).encode()),
                             (REQUEST_ID_HEADER.encode(), req.request_id.encode()), *bill]
        inner["headers"] += [(k.encode(), v.encode()) for k, v in tracing.inject().items()]
        await relay.run_local(req.app, inner, raw, req.receive, req.stream, req.response_headers, done,
                              self.placement.on_first(req.route), refuse)
