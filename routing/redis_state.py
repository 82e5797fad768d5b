"""Routing state shared through Redis: KV index, session pins, replica registry.

Keys (prefix `baton:`):
- `idx:h:{hash}`   set of replicas holding a block (Baton hash, tenant-salted)
- `idx:r:{replica}` set of blocks a replica holds (to clear it at once)
- `idx:c:{hash}`   set of child blocks seen after a block (its fan-out)
- `pin:{pool}:{session}` replica id, with the pin TTL
- `replicas:{pool}` hash replica id -> JSON {capacity_blocks, url, ts}

The KV indexer is the only writer of `idx:*`; a front reads one request's
slice (`queue_snapshot`, `snapshot_from`) in the same pipeline as the pins
and the registry, and writes pins with `pin_key`.
"""

from __future__ import annotations

import json
import time
from typing import Iterable, Sequence

from routing.snapshot import IndexSnapshot

P = "baton:"
INDEXER_STATS_KEY = f"{P}indexer:stats"  # hash: the KV indexer's totals (deployments/kv_indexer.py)
INDEX_EPOCH_KEY = f"{P}indexer:epoch"  # set while Redis holds the index; gone after Redis lost its data


def _h(h: int) -> str:
    return f"{P}idx:h:{h}"


class IndexWriter:
    """Applies translated KV events to Redis (sync client, one pipeline per event)."""

    def __init__(self, client) -> None:
        self.r = client

    def stored(self, replica: str, hashes: Sequence[int], parent: int | None) -> None:
        pipe = self.r.pipeline(transaction=False)
        prev = parent
        for h in hashes:
            pipe.sadd(_h(h), replica)
            if prev is not None:
                pipe.sadd(f"{P}idx:c:{prev}", h)
            prev = h
        if hashes:
            pipe.sadd(f"{P}idx:r:{replica}", *hashes)
        pipe.execute()

    def removed(self, replica: str, hashes: Iterable[int]) -> None:
        hashes = list(hashes)
        if not hashes:
            return
        pipe = self.r.pipeline(transaction=False)
        for h in hashes:
            pipe.srem(_h(h), replica)
        pipe.srem(f"{P}idx:r:{replica}", *hashes)
        pipe.execute()

    def cleared(self, replica: str) -> None:
        """Forgets every block of `replica` (it cleared its cache or died)."""
        held = self.r.smembers(f"{P}idx:r:{replica}")
        self.removed(replica, [int(h) for h in held])
        self.r.delete(f"{P}idx:r:{replica}")


def queue_snapshot(pipe, block_hashes: Sequence[int]) -> None:
    """Adds the reads of `snapshot_from` to a pipeline (2 commands per block)."""
    for h in block_hashes:
        pipe.smembers(_h(h))
    for h in block_hashes:
        pipe.scard(f"{P}idx:c:{h}")


def snapshot_from(block_hashes: Sequence[int], results: Sequence) -> IndexSnapshot:
    """The IndexSnapshot from the results of `queue_snapshot`."""
    n = len(block_hashes)
    holders = [{m.decode() if isinstance(m, bytes) else m for m in s} for s in results[:n]]
    return IndexSnapshot(block_hashes, holders, results[n:2 * n])


def pin_key(pool: str, session: str) -> str:
    return f"{P}pin:{pool}:{session}"


def registry_key(pool: str) -> str:
    return f"{P}replicas:{pool}"


class Registry:
    """Live engine replicas of each pool, kept fresh by their heartbeats."""

    def __init__(self, client, timeout_s: float) -> None:
        self.r, self.timeout_s = client, timeout_s

    @staticmethod
    def beat(sync_client, pool: str, replica: str, info: dict) -> None:
        """Writes `replica`'s entry with the current time (sync, from engine replicas)."""
        sync_client.hset(registry_key(pool), replica, json.dumps({**info, "ts": time.time()}))

    @staticmethod
    def entries(raw: dict) -> dict[str, dict]:
        """Decodes an HGETALL of a pool's registry hash."""
        return {(k.decode() if isinstance(k, bytes) else k): json.loads(v) for k, v in raw.items()}

    def fresh(self, entries: dict[str, dict], now: float) -> dict[str, dict]:
        return {k: v for k, v in entries.items() if now - v["ts"] <= self.timeout_s}

    async def live(self, pool: str) -> dict[str, dict]:
        """Replicas of `pool` whose last heartbeat is recent enough."""
        return self.fresh(self.entries(await self.r.hgetall(registry_key(pool))), time.time())
