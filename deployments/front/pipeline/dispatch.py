"""Stage 7, dispatch: the engine runs the request, here or on the chosen replica.

Runs decode in this process when the route chose this replica (or none), else
forwards the bytes to the chosen replica's internal server; a replica that
fails before the request's first token costs a retry here. Either way the
answer's bytes go to the client as the engine rendered them (relay.py).
"""

from __future__ import annotations

import json

from actors.finisher import INFO_HEADER, ask_usage, usage_headers
from common import tracing
from common.constants import REQUEST_ID_HEADER, SESSION_HEADER
from deployments.front import relay
from deployments.front.pipeline.request import Request

_REPLACED = (b"content-length", b"content-type", b"x-request-id", INFO_HEADER)


class Dispatch:
    """Sends each request's engine body to its engine and its answer to the client."""

    def __init__(self, replica: str, http, timeout_s: float, metrics) -> None:
        self.replica, self.http, self.timeout_s, self.metrics = replica, http, timeout_s, metrics

    async def __call__(self, req: Request, done, on_first=None) -> None:
        """Runs `req` to its answer; `done(timing)` runs when the engine has produced it (finish.py),
        `on_first()` at its first bytes."""
        # Whose answer it is, for the Finisher's usage counters; chat and completion streams always
        # ask vLLM for usage (Responses and Messages streams report it anyway).
        bill = usage_headers(req.tenant, req.body["model"], req.kind in ("chat", "text") and ask_usage(req.body))
        raw = req.engine_body()
        route, scope, info = req.route, req.scope, req.info
        trace = tracing.inject()
        if route is not None and route.decode_replica != self.replica and route.decode_url:
            headers = {"content-type": "application/json", INFO_HEADER.decode(): json.dumps(info.body()),
                       REQUEST_ID_HEADER: req.request_id, **trace, **{k.decode(): v.decode() for k, v in bill}}
            for k, v in scope["headers"]:
                if k in (SESSION_HEADER.encode(), b"authorization"):
                    headers[k.decode()] = v.decode()
            try:
                await relay.run_remote(self.http, f"{route.decode_url}{scope['path']}", raw, headers, req.stream,
                                       req.response_headers, done, self.timeout_s, on_first)
                return
            except relay.UpstreamUnavailable as exc:
                info.retried_after = str(exc).split(":")[0]
                self.metrics.retries.inc()
        inner = dict(scope)
        inner["headers"] = [(k, v) for k, v in scope["headers"] if k not in (*_REPLACED, *dict(bill))]
        inner["headers"] += [(b"content-length", str(len(raw)).encode()),
                             (b"content-type", b"application/json"),
                             (INFO_HEADER, json.dumps(info.body()).encode()),
                             (REQUEST_ID_HEADER.encode(), req.request_id.encode()), *bill]
        inner["headers"] += [(k.encode(), v.encode()) for k, v in trace.items()]
        await relay.run_local(req.app, inner, raw, req.receive, req.stream, req.response_headers, done, on_first)
