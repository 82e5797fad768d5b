"""One front's view of what every front shares in Redis: the replica registry and the counts.

Each front writes its own requests in flight and queued prefill blocks per
replica (`redis_state.inflight_key`, `work_key`: one field per replica and
front), and reads everyone's to price a replica's load. At 64 replicas that
is 4,096 fields per pool, too much to read on every request at GPU rates
(`baton bench scale --part control`). So a front keeps the last read for
`routing.shared_state_ms` and refreshes it beside the request path; a
decision reads it inline only when there is no view younger than ten times
that (a front's first request, or one after a long idle spell). With 0 every
decision reads it, as before. The front's own counts are always current
(request_routing takes the larger of its own and the view's).
"""

from __future__ import annotations

import asyncio
import time

from routing import redis_state

POOLS = ("decode", "prefill")
_KEYS = (redis_state.registry_key, redis_state.inflight_key, redis_state.work_key)


class SharedView:
    def __init__(self, registry: redis_state.Registry, max_age_s: float, send, on_error):
        """`send(queue)` runs writes without waiting (dead fronts' fields are dropped through it);
        `on_error()` counts a refresh that failed."""
        self.registry, self.max_age_s, self.stale_s = registry, max_age_s, 10 * max_age_s
        self._send, self._on_error = send, on_error
        self._view: tuple | None = None  # (read at, registry entries, in flight, queued work)
        self._refreshing: asyncio.Future | None = None

    def usable(self, now: float) -> bool:
        """Whether a decision at `now` may use the view without reading it inline."""
        return self._view is not None and now - self._view[0] < self.stale_s

    @staticmethod
    def queue(pipe) -> int:
        """Adds the view's reads to `pipe`; returns how many replies they take."""
        for key in _KEYS:
            for pool in POOLS:
                pipe.hgetall(key(pool))
        return len(_KEYS) * len(POOLS)

    def take(self, res: list, now: float) -> None:
        """Makes the replies of `queue`, read at `now`, the view. Drops the fields of fronts that are
        no longer live (a dead front cannot take its counts back)."""
        k = len(POOLS)
        entries = {pool: redis_state.Registry.entries(res[i]) for i, pool in enumerate(POOLS)}
        fronts = self.registry.fresh(entries["decode"], now)  # every front is a decode replica
        inflight, work = {}, {}
        for j, (out, key, cast) in enumerate(((inflight, redis_state.inflight_key, int),
                                              (work, redis_state.work_key, float))):
            for i, pool in enumerate(POOLS):
                out[pool], dead = redis_state.inflight_totals(res[(j + 1) * k + i], fronts, cast)
                if dead:
                    self._send(lambda p, key=key(pool), dead=dead: p.hdel(key, *dead))
        self._view = (now, entries, inflight, work)

    def get(self, redis, now: float) -> tuple[dict, dict, dict]:
        """(live replicas per pool, in flight per pool and replica, queued work per pool and replica)
        at `now`; starts a refresh beside the caller when the view is older than `max_age_s`."""
        read_at, entries, inflight, work = self._view
        if now - read_at >= self.max_age_s and self._refreshing is None:
            self._refreshing = asyncio.ensure_future(self._refresh(redis))
        return {pool: self.registry.fresh(entries[pool], now) for pool in POOLS}, inflight, work

    async def _refresh(self, redis) -> None:
        """Reads the view again; keeps the old one if Redis fails."""
        try:
            pipe = redis.pipeline(transaction=False)
            self.queue(pipe)
            res = await pipe.execute()
            self.take(res, time.time())
        except Exception:  # noqa: BLE001 - a failed refresh leaves the view as it was
            self._on_error()
        finally:
            self._refreshing = None
