"""Stage 1, auth: whose request it is, and whether another site should run it.

The tenant is the API key's (deployments/api/request_headers.py), a batch line's
(set in-process by deployments/batch/batch_runner.py), or the one another site
admitted it for (its site token checked). `Sites` is the strategy for requests
of other sites: `NoSites` when `sites.peers` is empty, else
deployments/sites/site_link.py's `SiteLink`.
"""

from __future__ import annotations

from deployments.api.bodies import check_length, read_body
from deployments.api.request_headers import tenant_of
from deployments.front.pipeline.request import Request


class NoSites:
    """One site: nothing is forwarded here and nothing is offloaded."""

    def forwarded_tenant(self, scope) -> None:
        return None

    def authorised(self, scope) -> bool:
        return False

    def turn_places(self, scope, forwarded: bool) -> int:
        return 0

    async def offload(self, scope, receive, send, tenant: str, parse) -> tuple[bool, None]:
        return False, None

    def start(self) -> None:
        """Nothing to probe."""


class Auth:
    """Sets a request's tenant; refuses (401, 413) what cannot be served."""

    def __init__(self, serve, keys, sites) -> None:
        self.serve, self.keys, self.sites = serve, keys, sites

    async def __call__(self, req: Request) -> None:
        """Sets `req.tenant` and `req.forwarded`; an APIError (401, 413) refuses it."""
        scope = req.scope
        forwarded = self.sites.forwarded_tenant(scope)
        req.forwarded = forwarded is not None
        req.tenant = scope.get("baton.tenant") or forwarded or tenant_of(scope, self.serve, self.keys)
        await check_length(scope, req.receive, self.serve.max_body_bytes)

    async def offloaded(self, req: Request, parse) -> bool:
        """Whether another site answered the request (sites.py's policy chose it); a request that
        came from another site, or from a batch, runs here, and so does a Responses request: the
        chain it continues and the response it stores live in this site's Redis, which another
        site cannot read (`baton bench chaos --layout sites` saw chains break and responses go
        missing when they left). May read `req.raw` (validated by `parse`)."""
        if req.forwarded or "baton.tenant" in req.scope or req.kind == "responses":
            return False
        done, req.raw = await self.sites.offload(req.scope, req.receive, req.send, req.tenant, parse)
        return done

    async def body(self, req: Request) -> bytes:
        """The request's body, read once."""
        if req.raw is None:
            req.raw = await read_body(req.receive, self.serve.max_body_bytes)
        return req.raw
