"""Whether this replica's front can serve a request now.

Ready means: this replica's engine is alive and, unless colocated, at least
one prefill replica has a fresh entry in the Redis registry (without one,
decode would compute every prompt itself, which works but is not the
configured system). Until then /health and /v1/models answer 503 with
Retry-After. The registry check is cached for a second.
"""

from __future__ import annotations

import time

from common.config import BatonConfig
from routing.prefix.redis_state import Registry


class Readiness:
    def __init__(self, cfg: BatonConfig, redis_client, engine, cache_s: float = 1.0):
        self.colocated = cfg.colocated
        self.registry = Registry(redis_client, cfg.routing.replica_timeout_s)
        self.engine = engine
        self.cache_s = cache_s
        self._last: tuple[float, bool, str] = (float("-inf"), False, "not checked")

    async def check(self) -> tuple[bool, str]:
        """(ready, why not); reads Redis at most once per `cache_s`."""
        if self.engine.errored():
            return False, "engine is dead"
        if self.colocated:
            return True, ""
        now = time.monotonic()
        if now - self._last[0] < self.cache_s:
            return self._last[1], self._last[2]
        try:
            ready = bool(await self.registry.live("prefill"))
            why = "" if ready else "no prefill replica is up yet"
        except Exception as exc:  # noqa: BLE001 - Redis away: not ready
            ready, why = False, f"routing state unavailable ({type(exc).__name__})"
        self._last = (now, ready, why)
        return ready, why
