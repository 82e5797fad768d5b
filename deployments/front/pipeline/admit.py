"""Stage 2, admission: an engine permit from the tenant's fair queue, or a 429.

A refused request costs no body read, no parse and no tokenising; a queued one
waits with its body unread. The permit is released in finish.py only.
"""

from __future__ import annotations

import time

from deployments.admission import AsyncAdmission, Shed
from deployments.api.bodies import small_body
from deployments.api.request_headers import deadline_of, tier_of
from deployments.api.schemas import APIError
from deployments.front.metrics import IngressMetrics
from deployments.front.pipeline.request import Request


class Admit:
    """Takes a permit for each request from the front's admission (`gate`)."""

    def __init__(self, gate: AsyncAdmission, metrics: IngressMetrics, tiers, sites) -> None:
        self.gate, self.metrics, self.tiers, self.sites = gate, metrics, tiers, sites

    async def __call__(self, req: Request) -> None:
        """Sets `req.permit`, counted in the tenant's permits; APIError 429 when the tenant's queue
        refuses it. A refusal of a request whose body is small enough to be read already also closes
        the connection, so the client's next request may reach another replica (a replica that refuses
        fast would otherwise get ever more traffic over kept-alive connections while its peers sit on
        streams). A session's turn at its site may take places beyond the queue's bounds
        (deployments/sites/site_link.py `turn_places`)."""
        scope, tenant = req.scope, req.tenant
        extra = self.sites.turn_places(scope, req.forwarded)
        waited = time.monotonic()
        try:
            req.permit = await self.gate.acquire(tenant, tier_of(scope, self.tiers), deadline_of(scope), extra)
        except Shed as exc:
            self.metrics.shed.labels(tenant, exc.reason).inc()
            headers = {**exc.headers, "Connection": "close"} if small_body(scope) else exc.headers
            raise APIError(429, f"Baton is at capacity ({exc.reason}); retry after "
                                f"{exc.retry_after_s} s", "rate_limit_error", code=exc.reason,
                           headers=headers) from None
        self.metrics.queue.observe(time.monotonic() - waited)
        self.metrics.admitted.labels(tenant).inc()
        self.metrics.permits.labels(tenant).inc()
