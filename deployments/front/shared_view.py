"""One front's view of what every front shares in Redis: the replica registry and the counts.

Each front writes its own requests in flight and queued prefill blocks per
replica (`redis_state.inflight_key`, `work_key`: one field per replica and
front, an absolute count) and, in the same transaction, adds the change to the
replica's sum (`redis_state.sum_key`). A routing read takes the sums: 64
fields at 64 replicas, where the fields are 4,096 (`baton bench scale --part
control`). Every `RECOUNT_S`, and on a front's first read, the view is read
with `redis_state.RECOUNT` instead, which rebuilds the sums from the fields of
live fronts and drops a dead front's fields (its requests died with it), so a
lost increment lasts until the next recount at most.

A front keeps the view for `routing.shared_state_ms` and refreshes it beside
the request path; a decision reads it inline only when there is no view
younger than ten times that. With 0 every decision reads it. The front's own
counts are always current (request_routing takes the larger of its own and
the view's).
"""

from __future__ import annotations

import asyncio
import time

from routing.prefix import redis_state

POOLS = ("decode", "prefill")
RECOUNT_S = 5.0
_COUNTS = ((redis_state.inflight_key, int), (redis_state.work_key, float))


class SharedView:
    def __init__(self, redis, registry: redis_state.Registry, max_age_s: float, on_error):
        """`on_error()` counts a refresh that failed."""
        self.registry, self.max_age_s, self.stale_s = registry, max_age_s, 10 * max_age_s
        self._recount = redis.register_script(redis_state.RECOUNT) if redis is not None else None
        self._on_error = on_error
        self._view: tuple | None = None  # (read at, registry entries, in flight, queued work)
        self._recounted = 0.0
        self._refreshing: asyncio.Future | None = None
        self._live: tuple | None = None  # (view, valid from, valid until, live replicas per pool): `get`'s last answer
        self._gone: set[tuple[str, str]] = set()  # (pool, replica): dead, whatever the registry says yet

    def usable(self, now: float) -> bool:
        """Whether a decision at `now` may use the view without reading it inline."""
        return self._view is not None and now - self._view[0] < self.stale_s

    async def queue(self, pipe, now: float) -> int:
        """Adds the view's reads to `pipe` (a recount when one is due); returns how many replies."""
        full = now - self._recounted >= RECOUNT_S
        for pool in POOLS:
            pipe.hgetall(redis_state.registry_key(pool))
        for key, _ in _COUNTS:
            for pool in POOLS:
                if full:
                    await self._recount(keys=[redis_state.registry_key("decode"), key(pool),
                                              redis_state.sum_key(key(pool))],
                                        args=[now, self.registry.timeout_s], client=pipe)
                else:
                    pipe.hgetall(redis_state.sum_key(key(pool)))
        return (1 + len(_COUNTS)) * len(POOLS)

    def take(self, res: list, now: float) -> None:
        """Makes the replies of `queue`, read at `now`, the view."""
        k = len(POOLS)
        entries = {pool: redis_state.Registry.entries(res[i]) for i, pool in enumerate(POOLS)}
        full = isinstance(res[k], list)  # a recount answers a flat list, a sum hash a dict
        counts = []
        for j, (_, cast) in enumerate(_COUNTS):
            per_pool = {}
            for i, pool in enumerate(POOLS):
                raw = res[(j + 1) * k + i]
                pairs = zip(raw[::2], raw[1::2]) if full else raw.items()
                per_pool[pool] = {(r.decode() if isinstance(r, bytes) else r): max(0, cast(float(v)))
                                  for r, v in pairs}
            counts.append(per_pool)
        if full:
            self._recounted = now
        self._view = (now, entries, *counts)

    def recount_soon(self) -> None:
        """Makes the next read of the view a recount (`RECOUNT`), whatever its age: the sums are
        rebuilt from the fields then."""
        self._recounted = 0.0

    def get(self, redis, now: float) -> tuple[dict, dict, dict]:
        """(live replicas per pool, in flight per pool and replica, queued work per pool and replica)
        at `now`; starts a refresh beside the caller when the view is older than `max_age_s`."""
        view = self._view
        read_at, entries, inflight, work = view
        if now - read_at >= self.max_age_s and self._refreshing is None:
            self._refreshing = asyncio.ensure_future(self._refresh(redis))
        return self._fresh(view, entries, now), inflight, work

    def forget(self, pool: str, replica: str) -> None:
        """Leaves `replica` out of every later answer of `get`, even while a registry read still
        lists it (this front's own replica, whose engine died). Changes the view."""
        self._gone.add((pool, replica))
        self._live = None

    def _fresh(self, view: tuple, entries: dict, now: float) -> dict:
        """The live replicas per pool at `now`. The same dicts, not copies, until the view changes or
        a heartbeat in it ages out (or `now` goes back), so a caller may key what it derives from
        them on their identity (request_routing's per-pool loads)."""
        cached = self._live
        if cached is not None and cached[0] is view and cached[1] <= now <= cached[2]:
            return cached[3]
        live = {pool: self.registry.fresh(entries[pool], now) for pool in POOLS}
        for pool, replica in self._gone:
            live[pool].pop(replica, None)
        timeout = self.registry.timeout_s
        expiry = min((e["ts"] + timeout for pool in POOLS for e in live[pool].values()), default=float("inf"))
        self._live = (view, now, expiry, live)
        return live

    async def _refresh(self, redis) -> None:
        """Reads the view again; keeps the old one if Redis fails."""
        try:
            pipe = redis.pipeline(transaction=False)
            now = time.time()
            await self.queue(pipe, now)
            self.take(await pipe.execute(), now)
        except Exception:  # noqa: BLE001 - a failed refresh leaves the view as it was
            self._on_error()
        finally:
            self._refreshing = None
