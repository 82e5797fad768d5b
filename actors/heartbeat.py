"""An engine replica's entry in the Redis registry, refreshed on a thread.

The entry says how many KV blocks the replica has and, read fresh at every
beat, the engine's load (`unfinished`: requests running or waiting in the
engine, whichever front sent them). Routers treat a replica whose entry has
gone stale as dead, which is how a killed replica leaves the candidate set
within seconds.
"""

from __future__ import annotations

import threading
from typing import Callable

import redis

from common.config import BatonConfig
from routing.prefix.redis_state import Registry, registry_key


class Heartbeat:
    def __init__(self, cfg: BatonConfig, pool: str, replica: str, info: dict,
                 load: Callable[[], dict] | None = None):
        self.client = cfg.redis.client(socket_timeout=2)
        self.pool, self.replica, self.info, self.load = pool, replica, info, load
        self.interval = cfg.routing.heartbeat_s
        self._stop = threading.Event()
        self.beat()
        self._thread = threading.Thread(target=self._run, name="baton-heartbeat", daemon=True)
        self._thread.start()

    def beat(self) -> None:
        """Writes this replica's registry entry with the current time and load."""
        Registry.beat(self.client, self.pool, self.replica, {**self.info, **(self.load() if self.load else {})})

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except redis.RedisError:
                pass  # Redis briefly away: the next beat retries

    def stop(self) -> None:
        """Stops beating and removes the entry (a clean shutdown, or an engine that died), after a
        beat in progress: one landing after the removal would list the replica again."""
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.client.hdel(registry_key(self.pool), self.replica)
        except redis.RedisError:
            pass
