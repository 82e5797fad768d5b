"""The front's side of routing: one decision per request, on shared state.

For each request it hashes the prompt's full blocks with the tenant's salt
(what the session's last prompt lacked, routing/prefix/hash_memo.py), matches
them against the KV index in its memory (deployments/kv_index/index_feed.py),
reads the session's pins, or places a new session, from the pins in its memory
(deployments/front/pin_feed.py; from Redis while that copy loads), and the
pure policy picks a decode replica and, unless it can get all but a few tokens
of the prompt from its own cache or the Mooncake store (decode-only), a
prefill replica. Pin writes do not wait for Redis. Load per replica
(deployments/front/shared_view.py) is what every live front has in flight
there (or this front, if more), the prefill blocks sent to it and not yet
computed (priced at the pool's measured rate), its empty KV blocks from its
heartbeat, and how long its engine's oldest unscheduled request has waited.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time

import redis

from common.config import BatonConfig
from common.constants import STORE_REPLICA
from deployments.front.load_board import LoadBoard, Tally
from deployments.front.metrics import IngressMetrics
from deployments.front.pin_feed import CHANNEL as PIN_CHANNEL, LocalPins, PinWriter, message as pin_message
from deployments.front.routes import Reads, Route
from deployments.front.shared_view import POOLS, SharedView
from deployments.kv_index.index_feed import LocalIndex
from routing.policy.contracts import RoutingDecision, RoutingRequest
from routing.policy.policy import BatonPolicy, PolicyConfig
from routing.policy.rates import mean_rate, median_rate
from routing.prefix import redis_index, redis_state
from routing.prefix.hash_memo import HashMemo
from routing.prefix.snapshot import pins_view

# After a failed count write, the next waits this long: with Redis away, each change would
# otherwise try a write of every count (~0.15 ms of the front's CPU at 64 replicas) and fail.
COUNT_RETRY_S = 0.5
_NONE: dict = {}  # no counts or sessions in a pool (one object, so the load board sees it unchanged)


class RequestRouting:
    def __init__(self, cfg: BatonConfig, redis_client, metrics: IngressMetrics, front: str = "front"):
        self.cfg = cfg
        self.front = front  # this front's replica id: its fields in the shared in-flight counts
        self.bs = cfg.model.block_size
        self.redis = redis_client
        self.registry = redis_state.Registry(redis_client, cfg.routing.replica_timeout_s)
        # Where the engines that compute prompts load prefixes from the pool, the cost prices what
        # the pool holds as loads, not recompute (routing/policy/cost.py).
        pooled = cfg.mooncake.colocated_pool if cfg.colocated else cfg.mooncake.prefix_reuse
        self.policy = BatonPolicy(PolicyConfig(shared_tier=STORE_REPLICA if pooled else None),
                                  rng=random.Random(cfg.routing.seed))
        self.inflight: dict[str, Tally] = {"prefill": Tally(), "decode": Tally()}
        self.work: dict[str, Tally] = {"prefill": Tally(), "decode": Tally()}
        # Each pool's loads, rebuilt per replica only where an input changed (load_board.py).
        self.boards = {pool: LoadBoard(self.inflight[pool], self.work[pool]) for pool in POOLS}
        self._rr = {"prefill": itertools.count(), "decode": itertools.count()}
        # Placement tickets with the pins in memory: each front's own turns, from its own offset.
        self._tickets = itertools.count(random.Random(front).randrange(1 << 16))
        self.metrics = metrics
        self._pending: set[asyncio.Future] = set()
        self._place = redis_client.register_script(redis_state.PLACE) if redis_client is not None else None
        # The index in this front's memory, kept by the indexer's feed (index_feed.py).
        self.local = LocalIndex(redis_client) if redis_client is not None and cfg.routing.local_index else None
        # Every session's pins in this front's memory, kept by the fronts' pin feed (pin_feed.py).
        self.pins = LocalPins(redis_client, cfg.routing.pin_ttl_s, time.time) if self.local is not None else None
        # Pin writes, one pipeline per flush, kept while Redis is away (pin_feed.py).
        self.writer = PinWriter(redis_client, time.time, self.pins is not None, metrics.write_errors.inc, self._track)
        self.view = SharedView(redis_client, self.registry, cfg.routing.shared_state_ms / 1000,
                               metrics.write_errors.inc)
        self._sent: dict[tuple[str, str], tuple[int, float]] = {}  # what _publish last wrote per replica
        self._resend = False  # a count write failed: the next _publish writes them all
        self._queued: list = []  # count-write arguments waiting for the next write (_in_order)
        self._order = asyncio.Lock()
        self.memo = HashMemo(self.bs)  # a turn rehashes only what it adds (routing/prefix/hash_memo.py)
        self._derived: dict[str, tuple] = {}  # pool -> (live replicas, names, per-replica load inputs): _statics

    def _cap(self, blocks: int, prompt_len: int) -> int:
        # vLLM always computes the last prompt token itself.
        return min(blocks * self.bs, (prompt_len - 1) // self.bs * self.bs)

    async def _read(self, hashes: tuple[int, ...], session: str | None, now: float) -> Reads:
        """Everything one decision needs, in at most one round trip: the pins, the index slice and
        the registry with every front's counts where this front has no copy of them (pin_feed.py,
        index_feed.py, shared_view.py). With the index and view at hand it reads only the pins of
        the pools that have live replicas, in one MGET (a pipeline's bookkeeping was a tenth of a
        decision), and with the pins too, nothing."""
        local = None
        if self.local is not None:
            self.local.start()
            self.pins.start()
            local = self.local.index
        if local is not None and self.view.usable(now):
            live, inflight, work = self.view.get(self.redis, now)
            pools = [pool for pool in POOLS if live[pool]] if session else []
            if self.pins.synced:
                values = [self.pins.get(pool, session, now) for pool in pools]
            else:
                values = await self.redis.mget([redis_state.pin_key(pool, session) for pool in pools]) if pools else []
            return Reads(local, live, self._pins(pools, values), inflight, work=work)
        pipe = self.redis.pipeline(transaction=False)
        if local is None:
            redis_index.queue_snapshot(pipe, hashes)
        inline = 0 if self.view.usable(now) else await self.view.queue(pipe, now)
        pools = list(POOLS) if session else []
        for pool in pools:
            pipe.get(redis_state.pin_key(pool, session))
        res = await pipe.execute() if len(pipe) else []
        n = 2 * len(hashes) if local is None else 0
        if inline:
            self.view.take(res[n:n + inline], now)
        live, inflight, work = self.view.get(self.redis, now)
        snap = local if local is not None else redis_index.snapshot_from(hashes, res[:n])
        return Reads(snap, live, self._pins(pools, res[n + inline:]), inflight, work=work)

    @staticmethod
    def _pins(pools: list[str], values: list) -> dict[str, str | None]:
        """The session's pinned replica per pool, from the values read for `pools` (None elsewhere)."""
        pins = dict.fromkeys(POOLS)
        for pool, v in zip(pools, values):
            pins[pool] = v.decode() if isinstance(v, bytes) else v
        return pins

    async def _read_placement(self, state: Reads, session: str, now: float) -> None:
        """For each pool where `session` has no live pin (new, or its replica left): records in
        `state` each live replica's live sessions and a ticket that takes turns among the tied.
        From this front's copy of the pins, in step (pin_feed.py), with its own tickets: no round
        trip. Else `redis_state.PLACE`, which also reserves the place (`state.reserved`; Redis's
        ticket counter and the replica's session set, corrected by `_write_pins`)."""
        pools = [p for p in POOLS if state.live[p] and state.pins[p] not in state.live[p]]
        if self.pins is not None and self.pins.synced:
            for pool in pools:
                state.placement[pool] = next(self._tickets)
                state.sessions[pool] = self.pins.sessions(pool, state.live[pool])
            return
        ttl_s = self.cfg.routing.pin_ttl_s

        async def place(pool: str) -> None:
            names = sorted(state.live[pool])
            res = await self._place(keys=[redis_state.placement_key(pool)]
                                    + [redis_state.sessions_key(pool, r) for r in names],
                                    args=[session, now - ttl_s, now, int(ttl_s * 1000)])
            state.placement[pool], state.reserved[pool] = int(res[0]), names[int(res[1])]
            state.sessions[pool] = dict(zip(names, map(int, res[2:])))
        await asyncio.gather(*(place(p) for p in pools))

    def _choose(self, pool: str, req: RoutingRequest, state: Reads, now: float,
                match: dict[str, int] | None = None) -> RoutingDecision | None:
        live = state.live[pool]
        match = state.snap.match(req.block_hashes) if match is None else match
        if not live:
            return None
        if self.cfg.routing.policy in ("round_robin", "least_loaded"):  # peers for benchmarks
            names = sorted(live)
            turn = next(self._rr[pool])
            choice = names[turn % len(names)]
            if self.cfg.routing.policy == "least_loaded":  # fewest in flight, ties in turn
                mine, theirs, k = self.inflight[pool].get, state.inflight[pool].get, len(names)  # as _loads counts
                choice = names[min(range(k), key=lambda i: (max(mine(names[i], 0), theirs(names[i], 0)), (i - turn) % k))]
            return RoutingDecision(choice, "load", match.get(choice, 0))
        names, base = self._statics(pool, state.live)
        view = pins_view(self.cfg.routing.pin_ttl_s, req.session, state.pins[pool], now)
        loads = self.boards[pool].update(live, names, base, state.inflight[pool], state.work.get(pool, _NONE),
                                         state.sessions.get(pool, _NONE), now)
        return self.policy.route(req, loads, state.snap, view, now, state.placement.get(pool), match)

    def _statics(self, pool: str, live: dict[str, dict[str, dict]]) -> tuple[list[str], dict[str, tuple]]:
        """`pool`'s replicas in name order, and per replica what its load takes from the registry:
        (capacity, free KV blocks, seconds per block computed, per block loaded). Derived once per
        `live` (shared_view.py hands out the same dicts until the view or a replica's liveness
        changes), not per decision: at 64 replicas it was a tenth of one."""
        cached = self._derived.get(pool)
        if cached is not None and cached[0] is live:
            return cached[1], cached[2]
        entries, bs = live[pool], self.bs
        # Seconds per token loaded from the store: the store's and the wire's speed, in any pool.
        store_rate = mean_rate((e for p in POOLS for e in live[p].values()), "load_s_per_token")
        pool_rate = median_rate(entries.values(), "prefill_s_per_token") * bs  # routing/policy/rates.py
        base = {n: (max(1, e.get("kv_blocks") or e.get("capacity_blocks", 1)),
                    int(e.get("kv_empty_blocks", e.get("kv_free_blocks", 0))),
                    pool_rate, float(e.get("load_s_per_token") or store_rate) * bs)
                for n, e in entries.items()}
        names = sorted(entries)
        self._derived[pool] = (live, names, base)
        return names, base

    def _write_pins(self, session: str | None, chosen: dict[str, str], state: Reads, now: float) -> None:
        """Pins (or re-pins) the session in each pool of `chosen`, and counts it among the live
        sessions of those replicas only: no longer among its previous replica's, nor its
        reservation's (`_read_placement`) where the policy chose another replica or the pool
        was not used. A pin kept where it was and written less than `pin_feed.REFRESH` of its
        TTL ago is not written again (an agent's turns come seconds apart). Does not wait for Redis."""
        if session and self.pins is not None and self.pins.synced:
            chosen = {pool: r for pool, r in chosen.items()
                      if r != state.pins[pool] or not self.pins.fresh(pool, session, now)}
        if not session or not (chosen or state.reserved):
            return
        ttl_s = self.cfg.routing.pin_ttl_s
        ttl = int(ttl_s * 1000)
        pins = [(pool, session, replica, now + ttl_s) for pool, replica in chosen.items()]
        if self.pins is not None:
            self.pins.wrote(pins)

        # Session sets serve placements read from Redis: unused where the pins are in memory.
        counted = not (self.pins is not None and self.pins.synced and not state.reserved)

        def queue(pipe) -> None:
            for pool in POOLS:
                replica = chosen.get(pool)
                stale = {state.reserved.get(pool)} | ({state.pins[pool]} if replica else set())
                for old in stale - {None, replica} if counted else ():
                    pipe.zrem(redis_state.sessions_key(pool, old), session)
                if replica is None:
                    continue
                pipe.set(redis_state.pin_key(pool, session), replica, px=ttl)
                if counted:
                    key = redis_state.sessions_key(pool, replica)
                    pipe.zadd(key, {session: now})  # expired sessions leave at the next placement
                    pipe.pexpire(key, ttl)  # a replica that left takes its set with it
            if pins and self.pins is not None:  # after the SETs: a front that loads meanwhile misses neither
                pipe.publish(PIN_CHANNEL, pin_message(pins))
        self.writer.send(queue, pins)

    def _publish(self, counts: dict[str, str]) -> None:
        """Writes this front's in-flight count and queued prefill blocks on each (pool, replica) in
        `counts` that changed, and adds the change to the replica's sum (shared_view.py), in one
        unlogged script call (`redis_state.COUNTS`). A write lost between the two is undone by
        the next recount. After a write failed (Redis away, or restarted without the counts), the
        next call writes every count this front has written before, changed or not, and asks for
        a recount: a lost decrement would otherwise stay in Redis as a queue that is not there,
        for as long as this front sends that replica nothing."""
        full, self._resend = self._resend, False
        pairs = set(self._sent) | set(counts.items()) if full else counts.items()
        args: list = []
        for pool, replica in pairs:
            f = redis_state.inflight_field(replica, self.front)
            n, w = self.inflight[pool][replica], round(max(0.0, self.work[pool][replica]), 2)
            sent_n, sent_w = self._sent.get((pool, replica), (0, 0.0))
            self._sent[(pool, replica)] = (n, w)
            for key, value, delta in ((redis_state.inflight_key(pool), n, n - sent_n),
                                      (redis_state.work_key(pool), w, round(w - sent_w, 2))):
                if delta or full:
                    args += (key, f, value, replica, delta or "")
        if full:
            self.view.recount_soon()
        if args:
            self._queued += args
            if len(self._queued) == len(args):  # none waiting: a new write takes these and what follows
                self._track(asyncio.ensure_future(self._in_order()))

    async def _in_order(self) -> None:
        """Runs count writes one at a time, in the order they were made (asyncio.Lock wakes its
        waiters first come, first served): an older absolute count never lands after a newer one.
        Each takes every change queued until it runs, so that a busy front makes one call per
        Redis round trip, not one per change (the script applies them in order: the last value
        is set, the deltas add up). A write that fails marks every count for resending
        (`_publish`); one that meets a Redis without the script (restarted: its counts are gone,
        or as old as its last file rewrite) loads it, runs, and queues the resend at once. A failed
        write holds the next one back COUNT_RETRY_S."""
        async with self._order:
            args, self._queued = self._queued, []
            if not args:
                return
            try:
                try:
                    await self.redis.evalsha(redis_state.COUNTS_SHA, 0, *args)
                except redis.exceptions.NoScriptError:  # a Redis that restarted (or this front's first write)
                    await self.redis.script_load(redis_state.COUNTS)
                    await self.redis.evalsha(redis_state.COUNTS_SHA, 0, *args)
                    self._resend = True
                    self._publish({})  # every count again (and a recount), right behind this write
            except Exception:
                self._resend = True
                # Redis away: the changes made meanwhile wait, then go in one write (a full resend)
                await asyncio.sleep(COUNT_RETRY_S)
                raise

    def _track(self, task: asyncio.Future) -> None:
        """Keeps a write task in `_pending` until it is done."""
        self._pending.add(task)
        task.add_done_callback(self._written)

    def _written(self, task: asyncio.Future) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:  # a count write (pin flushes count their own)
            self.metrics.write_errors.inc()

    async def route(self, prompt_ids: list[int], tenant: str, session: str | None) -> Route:
        """Decides replicas for one request; refreshes or moves its session pins."""
        now = time.time()
        local = self.local.index if self.local is not None else None  # with it, no uncached tail is hashed
        hashes = tuple(self.memo.hashes(prompt_ids, tenant, session, local.known_blocks() if local else None))
        blocks = len(prompt_ids) // self.bs
        state = await self._read(hashes, session, now)
        if session and self.cfg.routing.policy == "baton":
            await self._read_placement(state, session, now)
        req = RoutingRequest(hashes, session, prompt_blocks=blocks)
        match = state.snap.match(hashes)  # once, for both pools and the store
        decode = self._choose("decode", req, state, now, match)
        if decode is None:
            self.metrics.decisions.labels("decode", "no_replicas").inc()
            self._write_pins(session, {}, state, now)  # takes back a prefill reservation
            return Route(None, None, False, "no_replicas", 0, prompt_blocks=blocks)
        chosen = {"decode": decode.replica}
        store_held = match.get(STORE_REPLICA, 0)
        reachable = self._cap(max(decode.cached_blocks, store_held), len(prompt_ids))
        self._count("decode", decode)
        route = Route(decode.replica, None, False, decode.reason, reachable, decode.repinned, blocks,
                      decode_url=state.live["decode"][decode.replica].get("url"))
        prefill = None
        if len(prompt_ids) - reachable >= self.cfg.routing.decode_only_max_uncached_tokens:
            prefill = self._choose("prefill", req, state, now, match)
        if prefill is None:  # short uncached tail, or no prefill pool alive: decode computes it
            route.decode_only = True
            route.work["decode"] = (len(prompt_ids) - reachable) / self.bs
        else:
            chosen["prefill"] = prefill.replica
            self._prefill_route(route, prefill, state, store_held, len(prompt_ids))
        self._write_pins(session, chosen, state, now)
        self._predictions(route, [d for d in (decode, prefill) if d is not None])
        return route

    def _prefill_route(self, route: Route, prefill: RoutingDecision, state: Reads, store_held: int,
                       prompt_len: int) -> None:
        """Sets `route`'s prefill replica, its store lookup and its predicted hit."""
        self._count("prefill", prefill)
        route.prefill_replica = prefill.replica
        route.prefill_url = state.live["prefill"][prefill.replica].get("url")
        # The prefill engine loads from the store what its own cache lacks (mooncake.prefix_reuse).
        reuse = store_held if self.cfg.mooncake.prefix_reuse else 0
        # Or where the prefill replica has prompts queued ahead: its engine may evict part of
        # what it holds before this prompt is scheduled, and a lookup then loads it back
        # instead of recomputing it (bench affinity PD: 11 of 120 pinned turns recomputed
        # 500-900 tokens the pool held).
        ahead = max(self.work["prefill"][prefill.replica], state.work.get("prefill", {}).get(prefill.replica, 0.0))
        route.prefill_lookup = reuse > prefill.cached_blocks or (reuse > 0 and ahead > 0)
        route.predicted_cached_tokens = self._cap(max(prefill.cached_blocks, reuse), prompt_len)
        route.work["prefill"] = (prompt_len - route.predicted_cached_tokens) / self.bs

    @staticmethod
    def _predictions(route: Route, decisions: list[RoutingDecision]) -> None:
        """Sets the route's predicted waits and moved pools from its pools' decisions."""
        route.moved = [pool for pool, d in zip(POOLS, decisions) if d.reason == "moved"]
        if all(d.predicted_s is not None for d in decisions):
            route.predicted_s = sum(d.predicted_s for d in decisions)
            route.stay_s = sum(d.predicted_s if d.stay_s is None else d.stay_s for d in decisions)

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
                self.work[pool][r] += route.work.get(pool, 0.0)
                route.in_flight.add(pool)
                counted[pool] = r
        if counted:
            self._publish(counted)

    def _release(self, route: Route, pool: str, replica: str | None) -> None:
        if pool in route.in_flight:
            self._take_work(route, pool, replica)
            route.in_flight.discard(pool)
            self.inflight[pool][replica] -= 1
            self._publish({pool: replica})

    def _take_work(self, route: Route, pool: str, replica: str | None) -> bool:
        """Takes the request's prefill blocks off its replica's queue; whether there were any."""
        blocks = route.work.pop(pool, 0.0) if pool in route.in_flight else 0.0
        if blocks:
            self.work[pool][replica] -= blocks
        return bool(blocks)

    def computed(self, route: Route) -> None:
        """The decode replica sent its first token: the prompt it computed leaves its queue.
        Calling it again, or after `finished`, changes nothing."""
        if self._take_work(route, "decode", route.decode_replica):
            self._publish({"decode": route.decode_replica})

    def prefill_done(self, route: Route) -> None:
        """Ends the prefill part; calling it again changes nothing."""
        self._release(route, "prefill", route.prefill_replica)

    def finished(self, route: Route) -> None:
        """Ends the request on its decode replica; idempotent."""
        self._release(route, "decode", route.decode_replica)
