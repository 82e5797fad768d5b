"""Stage 4, model: which app in this process runs the request's model, or which peer has it.

`OneModel`: the front serves its replica's one engine. `Catalogue`: many models
per replica (deployments/catalogue/): the request runs on the replica where its
session's model is resident, or here, woken if cold.
"""

from __future__ import annotations

from deployments.api.request_headers import deadline_of
from deployments.catalogue.model_routing import prefix_keys
from deployments.front.pipeline.request import Request


class OneModel:
    """The replica's one model, served by `app`."""

    def __init__(self, name: str, app) -> None:
        self.name, self.app = name, app

    def known(self, model: str) -> bool:
        return model == self.name

    def listing(self) -> None:
        """None: /v1/models is the engine's own answer."""
        return None

    async def __call__(self, req: Request) -> None:
        """Sets `req.app`."""
        req.app = self.app

    def finished(self, req: Request) -> None:
        """Nothing is held."""


class Catalogue:
    """A catalogue's engines here (`host`, deployments/catalogue/model_host.py) and the routing of
    its requests between replicas (`routing`, deployments/catalogue/model_routing.py)."""

    def __init__(self, name: str, host, routing, default_deadline_s: float) -> None:
        self.name, self.host, self.routing, self.default_deadline_s = name, host, routing, default_deadline_s

    def known(self, model: str) -> bool:
        return model == self.name or self.host.known(model)

    def listing(self) -> list[dict]:
        return self.host.listing()

    async def __call__(self, req: Request) -> None:
        """Sets `req.route` to a peer that has the model resident (its session's replica or
        another), with `req.app` the host, which runs it here, woken, if that peer fails; or sets
        `req.app` to the model's engine here, woken if cold and held until finish. A 429 if it
        cannot load by the request's deadline."""
        model = req.body["model"]
        prefixes = None if req.session else prefix_keys(req.tenant, req.body)
        if peer := await self.routing.peer(model, req.session, self.host.resident_here(model), prefixes):
            req.app, req.route = self.host, peer
            req.info.route, req.info.decode_only = peer.reason, True
            return
        req.app = await self.host.acquire(model, deadline_of(req.scope) or self.default_deadline_s)
        req.held_model = model

    def finished(self, req: Request) -> None:
        """Releases the model the request held here, once."""
        if req.held_model is not None:
            self.host.release(req.held_model)
            req.held_model = None
