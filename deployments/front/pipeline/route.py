"""Stage 5, route: which decode (and prefill) replica runs the request.

`Unrouted` (colocated without the KV-aware router): this replica's engine, or a
peer's when this one is full and the front holds more of the pool's permits
than it can run (routing/policy/spill.py). `Routed` (disaggregated, and
colocated with `routing.colocated_router`): the prompt rendered once by vLLM's
template and the routing policy's decision (deployments/front/request_routing.py).
"""

from __future__ import annotations

import time

import redis

from actors.finisher import error_code
from deployments.api.schemas import APIError
from deployments.front.pipeline.request import Request
from deployments.front.request_routing import RequestRouting, Route
from routing.policy.spill import SpillChooser


class Unrouted:
    """This replica's engine, or a colocated peer's when this one is full or dead."""

    redis = None  # no routing client: /metrics reads the indexer's through it where there is one

    def __init__(self, engine, capacity: int) -> None:
        self.engine = engine
        self.spill = SpillChooser(capacity)
        self.peer_urls: dict[str, str] = {}

    async def __call__(self, req: Request) -> None:
        """Sets `req.route` to a peer's engine when this one is full or dead, else leaves it None (here)."""
        req.info.route, req.info.decode_only = "colocated", True
        peer = self.spill.choose(self.engine.running(), not self.engine.errored())
        if peer is None or peer not in self.peer_urls:
            return
        self.spill.started(peer)
        req.route = Route(peer, None, True, "spill", 0, in_flight={"spill"}, decode_url=self.peer_urls[peer])
        req.info.route = req.route.reason

    def spill_view(self, peers: dict) -> None:
        """The other colocated fronts' engines (permit_leases.Peer), after a lease renewal."""
        self.peer_urls = {f: p.url for f, p in peers.items()}
        self.spill.update({f: p.running for f, p in peers.items()})

    def on_first(self, route: Route | None):
        return None

    def prefill_done(self, route: Route | None) -> None:
        """No prefill pool."""

    def finished(self, route: Route | None) -> None:
        """Frees the peer's place a spilled request held, once."""
        if route is not None and "spill" in route.in_flight:
            route.in_flight.discard("spill")
            self.spill.finished(route.decode_replica)


class Routed:
    """The KV-aware router's decision, counted in flight until finish."""

    def __init__(self, routing: RequestRouting, engine, metrics) -> None:
        self.routing, self.engine, self.metrics = routing, engine, metrics
        self.redis = routing.redis

    async def __call__(self, req: Request) -> None:
        """Renders the prompt (`req.ids`; a 400 if the template refuses it) and sets `req.route`; a
        Redis that is slow or away routes it to decode, which computes the prompt (counted). Once
        this replica's engine died, never to this replica."""
        if req.ids is None:  # rendered once: a request placed again (dispatch.py) keeps its ids
            try:
                t0 = time.perf_counter()
                req.ids = await self.engine.prompt_ids(req.kind, req.body)
                self.metrics.render_s.observe(time.perf_counter() - t0)
            except ValueError as exc:
                raise APIError(400, str(exc), code=error_code(400, str(exc))) from None
        if self.engine.errored():  # this replica's engine died: the others run it (replica.py _watch_engine
            # takes it out of the registry, for the other fronts)
            self.routing.view.forget("decode", self.routing.front)
        try:
            t0 = time.perf_counter()
            route = await self.routing.route(req.ids, req.tenant, req.session)
            self.metrics.route_s.observe(time.perf_counter() - t0)
        except redis.RedisError:
            route = Route(None, None, True, "fallback", 0)
            self.metrics.decisions.labels("decode", "fallback").inc()
        info = req.info
        info.route, info.decode_only = route.reason, route.decode_only
        info.predicted_cached_tokens = route.predicted_cached_tokens
        info.predicted_s, info.stay_s, info.moved = route.predicted_s, route.stay_s, route.moved or None
        self.routing.started(route)
        req.route = route

    def spill_view(self, peers: dict) -> None:
        """Routed fronts do not spill."""

    def on_first(self, route: Route | None):
        """What runs at the answer's first bytes: the prompt leaves its decode replica's queue."""
        return (lambda: self.routing.computed(route)) if route is not None else None

    def prefill_done(self, route: Route | None) -> None:
        """Ends the prefill part; idempotent."""
        if route is not None:
            self.routing.prefill_done(route)

    def finished(self, route: Route | None) -> None:
        """Ends the request on its replicas; idempotent."""
        if route is not None:
            self.routing.prefill_done(route)
            self.routing.finished(route)
