"""The ingress side of routing: one decision per request, on shared state.

For each request it hashes the prompt's full blocks with the tenant's salt,
reads the index slice and the session's pins from Redis in one round trip
each, asks the pure policy for a decode replica and, unless the decode
replica can get all but a few tokens of the prompt from its own cache or the
Mooncake store (then the request runs decode-only), for a prefill replica.
Load per replica is what this ingress has in flight there.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import Counter
from dataclasses import dataclass, field

from common.config import BatonConfig
from common.constants import STORE_REPLICA
from deployments.metrics import IngressMetrics
from routing import redis_state
from routing.block_hash import hash_blocks
from routing.contracts import ReplicaLoad, RoutingDecision, RoutingRequest
from routing.policy import BatonPolicy
from routing.snapshot import pins_view


@dataclass
class Route:
    """Where one request goes and what the index predicted for it."""

    decode_replica: str | None
    prefill_replica: str | None
    decode_only: bool
    reason: str  # pinned | prefix | load | round_robin | no_replicas
    predicted_cached_tokens: int  # on the replica that computes the prompt
    repinned: bool = False
    prompt_blocks: int = 0
    in_flight: set = field(default_factory=set)  # pools this request still occupies


class RequestRouting:
    def __init__(self, cfg: BatonConfig, redis_client, metrics: IngressMetrics):
        self.cfg = cfg
        self.bs = cfg.model.block_size
        self.redis = redis_client
        self.pins = redis_state.Pins(redis_client, cfg.routing.pin_ttl_s)
        self.registry = redis_state.Registry(redis_client, cfg.routing.replica_timeout_s)
        self.policy = BatonPolicy(rng=random.Random(cfg.routing.seed))
        self.inflight: dict[str, Counter] = {"prefill": Counter(), "decode": Counter()}
        self._rr = {"prefill": itertools.count(), "decode": itertools.count()}
        self.metrics = metrics
        self.live_decode_replicas = 0  # as of the last decision; admission sizes its permits by it

    def _cap(self, blocks: int, prompt_len: int) -> int:
        # vLLM always computes the last prompt token itself.
        return min(blocks * self.bs, (prompt_len - 1) // self.bs * self.bs)

    async def _choose(self, pool: str, req: RoutingRequest, snap, now: float) -> RoutingDecision | None:
        live = await self.registry.live(pool)
        if pool == "decode":
            self.live_decode_replicas = len(live)
        if not live:
            return None
        names = sorted(live)
        if self.cfg.routing.policy == "round_robin":
            choice = names[next(self._rr[pool]) % len(names)]
            return RoutingDecision(choice, "load", snap.match(req.block_hashes).get(choice, 0))
        loads = {n: ReplicaLoad(running=self.inflight[pool][n],
                                capacity=max(1, live[n].get("capacity_blocks", 1))) for n in names}
        pinned = await self.pins.get(pool, req.session) if req.session else None
        view = pins_view(self.cfg.routing.pin_ttl_s, req.session, pinned, now)
        decision = self.policy.route(req, loads, snap, view, now)
        if req.session:
            await self.pins.set(pool, req.session, decision.replica)
        return decision

    async def route(self, prompt_ids: list[int], tenant: str, session: str | None) -> Route:
        """Decides replicas for one request; refreshes or moves its session pins."""
        now = time.time()
        hashes = tuple(hash_blocks(prompt_ids, self.bs, tenant))
        snap = await redis_state.snapshot(self.redis, hashes)
        req = RoutingRequest(hashes, session)
        decode = await self._choose("decode", req, snap, now)
        if decode is None:
            return Route(None, None, False, "no_replicas", 0, prompt_blocks=len(hashes))
        store_held = snap.match(hashes).get(STORE_REPLICA, 0)
        reachable = self._cap(max(decode.cached_blocks, store_held), len(prompt_ids))
        self._count("decode", decode)
        route = Route(decode.replica, None, False, decode.reason, reachable, decode.repinned, len(hashes))
        if len(prompt_ids) - reachable < self.cfg.routing.decode_only_max_uncached_tokens:
            route.decode_only = True
            return route
        prefill = await self._choose("prefill", req, snap, now)
        if prefill is None:  # no prefill pool alive: decode computes the prompt itself
            route.decode_only = True
            return route
        self._count("prefill", prefill)
        route.prefill_replica = prefill.replica
        route.predicted_cached_tokens = self._cap(prefill.cached_blocks, len(prompt_ids))
        return route

    def _count(self, pool: str, d: RoutingDecision) -> None:
        reason = "round_robin" if self.cfg.routing.policy == "round_robin" else d.reason
        self.metrics.decisions.labels(pool, reason).inc()
        if d.repinned:
            self.metrics.repins.labels(pool).inc()

    def started(self, route: Route) -> None:
        """Counts the request as in flight on its replicas."""
        for pool, r in (("prefill", route.prefill_replica), ("decode", route.decode_replica)):
            if r:
                self.inflight[pool][r] += 1
                route.in_flight.add(pool)

    def _release(self, route: Route, pool: str, replica: str | None) -> None:
        if pool in route.in_flight:
            route.in_flight.discard(pool)
            self.inflight[pool][replica] -= 1

    def prefill_done(self, route: Route) -> None:
        """Ends the prefill part; calling it again changes nothing."""
        self._release(route, "prefill", route.prefill_replica)

    def finished(self, route: Route) -> None:
        """Ends the request on its decode replica; idempotent."""
        self._release(route, "decode", route.decode_replica)
