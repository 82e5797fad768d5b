"""Approximate prefix tree built from routing history (no engine events).

This mirrors Ray Serve's ``PrefixTree`` used by ``PrefixCacheAffinityRouter``:
each replica is a "tenant"; after routing, the request's prefix is inserted
under the chosen tenant; each tenant's share is bounded and evicted
least-recently-used. Because block hashes are chained, a trie over hash
sequences is equivalent to a map ``hash -> tenants`` with a per-tenant LRU,
so it reuses ``PrefixIndex`` and ``LRUBlockCache``. It is approximate because
it records what was *sent* to a replica, not what the replica still holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.prefix.lru_cache import LRUBlockCache
from routing.prefix.prefix_index import PrefixIndex


class ApproxPrefixTree:
    """Routing-history prefix tree with a per-tenant size bound (in blocks)."""

    def __init__(self, tenant_capacity: int) -> None:
        self.tenant_capacity = tenant_capacity
        self._index = PrefixIndex()
        self._lru: dict[str, LRUBlockCache] = {}

    def insert(self, block_hashes: Sequence[int], tenant: str) -> None:
        """Record that ``block_hashes`` were sent to ``tenant``; evicts its LRU
        entries beyond the bound. Changes the tree."""
        lru = self._lru.get(tenant)
        if lru is None:
            lru = self._lru[tenant] = LRUBlockCache(self.tenant_capacity)
        stored, evicted = lru.insert(block_hashes)
        self._index.apply_stored(tenant, stored)
        self._index.apply_removed(tenant, evicted)

    def match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """``{tenant: leading blocks matched}``. Changes nothing."""
        return self._index.match(block_hashes)

    def size(self, tenant: str) -> int:
        """Blocks recorded for ``tenant``."""
        lru = self._lru.get(tenant)
        return len(lru) if lru is not None else 0

    def remove_tenant(self, tenant: str) -> None:
        """Forget ``tenant``. Changes the tree."""
        self._lru.pop(tenant, None)
        self._index.remove_replica(tenant)
