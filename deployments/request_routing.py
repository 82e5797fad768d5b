"""The front's side of routing: one decision per request, on shared state.

For each request it hashes the prompt's full blocks with the tenant's salt
and reads, in one pipelined Redis round trip, the index slice of those
blocks, both pools' registries and the session's pins. The pure policy then
picks a decode replica and, unless the decode replica can get all but a few
tokens of the prompt from its own cache or the Mooncake store (the request
then runs decode-only), a prefill replica. Pin updates are written without
waiting for them. Load per replica is what its engine reported at its
last heartbeat, or what this front has in flight there if that is more,
and how long its oldest unscheduled request has waited.
"""

from __future__ import annotations

import asyncio
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
from routing.snapshot import IndexSnapshot, pins_view

POOLS = ("decode", "prefill")


@dataclass
class Route:
    """Where one request goes and what the index predicted for it."""

    decode_replica: str | None
    prefill_replica: str | None
    decode_only: bool
    reason: str  # pinned | prefix | load | round_robin | no_replicas | fallback
    predicted_cached_tokens: int  # on the replica that computes the prompt
    repinned: bool = False
    prompt_blocks: int = 0
    in_flight: set = field(default_factory=set)  # pools this request still occupies
    decode_url: str | None = None  # internal servers of the chosen replicas, from the registry
    prefill_url: str | None = None
    # Whether the index says the store holds more of the prompt than the prefill
    # engine's own cache: if not, the prefill engine skips its store lookup.
    prefill_lookup: bool = True


@dataclass
class _State:
    """What one decision reads from Redis."""

    snap: IndexSnapshot
    live: dict[str, dict[str, dict]]  # pool -> replica -> registry entry
    pins: dict[str, str | None]  # pool -> pinned replica
    inflight: dict[str, dict[str, int]]  # pool -> replica -> every live front's requests there


class RequestRouting:
    def __init__(self, cfg: BatonConfig, redis_client, metrics: IngressMetrics, front: str = "front"):
        self.cfg = cfg
        self.front = front  # this front's replica id: its fields in the shared in-flight counts
        self.bs = cfg.model.block_size
        self.redis = redis_client
        self.registry = redis_state.Registry(redis_client, cfg.routing.replica_timeout_s)
        self.policy = BatonPolicy(rng=random.Random(cfg.routing.seed))
        self.inflight: dict[str, Counter] = {"prefill": Counter(), "decode": Counter()}
        self._rr = {"prefill": itertools.count(), "decode": itertools.count()}
        self.metrics = metrics
        self._pending: set[asyncio.Future] = set()

    def _cap(self, blocks: int, prompt_len: int) -> int:
        # vLLM always computes the last prompt token itself.
        return min(blocks * self.bs, (prompt_len - 1) // self.bs * self.bs)

    async def _read(self, hashes: tuple[int, ...], session: str | None, now: float) -> _State:
        """Everything one decision needs, in one pipelined round trip."""
        pipe = self.redis.pipeline(transaction=False)
        redis_state.queue_snapshot(pipe, hashes)
        for pool in POOLS:
            pipe.hgetall(redis_state.registry_key(pool))
        for pool in POOLS:
            pipe.hgetall(redis_state.inflight_key(pool))
        if session:
            for pool in POOLS:
                pipe.get(redis_state.pin_key(pool, session))
        res = await pipe.execute()
        n, k = 2 * len(hashes), len(POOLS)
        live = {pool: self.registry.fresh(redis_state.Registry.entries(res[n + i]), now)
                for i, pool in enumerate(POOLS)}
        inflight = {}
        for i, pool in enumerate(POOLS):  # every front is a decode replica
            inflight[pool], dead = redis_state.inflight_totals(res[n + k + i], live["decode"])
            if dead:
                self._send(lambda p, pool=pool, dead=dead: p.hdel(redis_state.inflight_key(pool), *dead))
        pins = {pool: None for pool in POOLS}
        if session:
            for i, pool in enumerate(POOLS):
                v = res[n + 2 * k + i]
                pins[pool] = v.decode() if isinstance(v, bytes) else v
        return _State(redis_state.snapshot_from(hashes, res[:n]), live, pins, inflight)

    def _choose(self, pool: str, req: RoutingRequest, state: _State, now: float) -> RoutingDecision | None:
        live = state.live[pool]
        if not live:
            return None
        names = sorted(live)
        if self.cfg.routing.policy in ("round_robin", "least_loaded"):  # peers for benchmarks
            turn = next(self._rr[pool])
            choice = names[turn % len(names)]
            if self.cfg.routing.policy == "least_loaded":  # fewest in flight, ties in turn
                choice = min(names, key=lambda n: (self._load(pool, n, live[n], state),
                                                   (names.index(n) - turn) % len(names)))
            return RoutingDecision(choice, "load", state.snap.match(req.block_hashes).get(choice, 0))
        loads = {n: ReplicaLoad(running=self._load(pool, n, live[n], state),
                                capacity=max(1, live[n].get("kv_blocks") or live[n].get("capacity_blocks", 1)),
                                free_kv_blocks=int(live[n].get("kv_free_blocks", 0)),
                                oldest_wait_s=self._wait(live[n], now)) for n in names}
        view = pins_view(self.cfg.routing.pin_ttl_s, req.session, state.pins[pool], now)
        return self.policy.route(req, loads, state.snap, view, now)

    def _load(self, pool: str, replica: str, entry: dict, state: _State) -> int:
        """Requests on `replica`, the most of: what its engine reported at its last heartbeat
        (every front's, waiting or running, but up to `routing.heartbeat_s` old), what every
        live front had in flight there at this decision's read, and what this front has."""
        return max(self.inflight[pool][replica], int(entry.get("unfinished", 0)),
                   state.inflight[pool].get(replica, 0))

    @staticmethod
    def _wait(entry: dict, now: float) -> float:
        """How long the replica's oldest unscheduled request has waited by `now`: its engine's
        figure at the heartbeat, plus the heartbeat's age while anything was waiting."""
        wait = float(entry.get("oldest_wait_s") or 0.0)
        return wait + max(0.0, now - entry["ts"]) if entry.get("waiting") else wait

    def _write_pins(self, session: str | None, chosen: dict[str, str]) -> None:
        """Pins (or re-pins) the session, without waiting for Redis."""
        if not session or not chosen:
            return
        ttl = int(self.cfg.routing.pin_ttl_s * 1000)
        self._send(lambda pipe: [pipe.set(redis_state.pin_key(pool, session), replica, px=ttl)
                                 for pool, replica in chosen.items()])

    def _send(self, queue) -> None:
        """Runs the writes `queue` adds to a pipeline, without waiting for Redis."""
        pipe = self.redis.pipeline(transaction=False)
        queue(pipe)
        task = asyncio.ensure_future(pipe.execute())
        self._pending.add(task)
        task.add_done_callback(self._written)

    def _publish(self, counts: dict[str, str]) -> None:
        """Writes this front's in-flight count on each (pool, replica) in `counts`."""
        self._send(lambda pipe: [pipe.hset(redis_state.inflight_key(pool),
                                           redis_state.inflight_field(replica, self.front), self.inflight[pool][replica])
                                 for pool, replica in counts.items()])

    def _written(self, task: asyncio.Future) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.metrics.write_errors.inc()

    async def route(self, prompt_ids: list[int], tenant: str, session: str | None) -> Route:
        """Decides replicas for one request; refreshes or moves its session pins."""
        now = time.time()
        hashes = tuple(hash_blocks(prompt_ids, self.bs, tenant))
        state = await self._read(hashes, session, now)
        req = RoutingRequest(hashes, session)
        decode = self._choose("decode", req, state, now)
        if decode is None:
            self.metrics.decisions.labels("decode", "no_replicas").inc()
            return Route(None, None, False, "no_replicas", 0, prompt_blocks=len(hashes))
        chosen = {"decode": decode.replica}
        store_held = state.snap.match(hashes).get(STORE_REPLICA, 0)
        reachable = self._cap(max(decode.cached_blocks, store_held), len(prompt_ids))
        self._count("decode", decode)
        route = Route(decode.replica, None, False, decode.reason, reachable, decode.repinned, len(hashes),
                      decode_url=state.live["decode"][decode.replica].get("url"))
        prefill = None
        if len(prompt_ids) - reachable >= self.cfg.routing.decode_only_max_uncached_tokens:
            prefill = self._choose("prefill", req, state, now)
        if prefill is None:  # short uncached tail, or no prefill pool alive: decode computes it
            route.decode_only = True
        else:
            self._count("prefill", prefill)
            chosen["prefill"] = prefill.replica
            route.prefill_replica = prefill.replica
            route.prefill_url = state.live["prefill"][prefill.replica].get("url")
            # The prefill engine loads from the store what its own cache lacks (mooncake.prefix_reuse).
            reuse = store_held if self.cfg.mooncake.prefix_reuse else 0
            route.prefill_lookup = reuse > prefill.cached_blocks
            route.predicted_cached_tokens = self._cap(max(prefill.cached_blocks, reuse), len(prompt_ids))
        self._write_pins(session, chosen)
        return route

    def _count(self, pool: str, d: RoutingDecision) -> None:
        reason = d.reason if self.cfg.routing.policy == "baton" else self.cfg.routing.policy
        self.metrics.decisions.labels(pool, reason).inc()
        if d.repinned:
            self.metrics.repins.labels(pool).inc()

    def started(self, route: Route) -> None:
        """Counts the request as in flight on its replicas, here and in Redis."""
        counted = {}
        for pool, r in (("prefill", route.prefill_replica), ("decode", route.decode_replica)):
            if r:
                self.inflight[pool][r] += 1
                route.in_flight.add(pool)
                counted[pool] = r
        if counted:
            self._publish(counted)

    def _release(self, route: Route, pool: str, replica: str | None) -> None:
        if pool in route.in_flight:
            route.in_flight.discard(pool)
            self.inflight[pool][replica] -= 1
            self._publish({pool: replica})

    def prefill_done(self, route: Route) -> None:
        """Ends the prefill part; calling it again changes nothing."""
        self._release(route, "prefill", route.prefill_replica)

    def finished(self, route: Route) -> None:
        """Ends the request on its decode replica; idempotent."""
        self._release(route, "decode", route.decode_replica)
