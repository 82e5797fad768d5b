"""Bounded LRU cache of KV blocks for one simulated replica.

Capacity is counted in blocks. Like vLLM's free-block queue, a request's
blocks are touched from last to first so the prompt's head is the most
recently used: eviction eats conversations from the tail, which keeps the
cached part a prefix. Every insertion and eviction is returned so the caller
can emit the same ``stored``/``removed`` events an engine would.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class LRUBlockCache:
    """Block hash set with LRU eviction. Pure, not thread-safe."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()  # LRU first, MRU last

    def prefix_hits(self, block_hashes: Sequence[int]) -> int:
        """Length of the leading run of ``block_hashes`` held. Changes nothing."""
        n = 0
        for h in block_hashes:
            if h not in self._blocks:
                break
            n += 1
        return n

    def insert(self, block_hashes: Sequence[int]) -> tuple[list[int], list[int]]:
        """Hold ``block_hashes`` (at most ``capacity`` leading ones) as most recent.

        Touches blocks from last to first, so the first block ends up MRU.
        Changes the cache; returns ``(stored, evicted)``: hashes newly added,
        and hashes evicted to make room, in eviction order.
        """
        blocks = self._blocks
        keep = block_hashes[: self.capacity]
        stored: list[int] = []
        for h in reversed(keep):
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
                stored.append(h)
        stored.reverse()
        evicted: list[int] = []
        while len(blocks) > self.capacity:
            h, _ = blocks.popitem(last=False)
            evicted.append(h)
        return stored, evicted

    def clear(self) -> list[int]:
        """Drop every block; return them (LRU first)."""
        dropped = list(self._blocks)
        self._blocks.clear()
        return dropped

    def lru_order(self) -> list[int]:
        """Held hashes, least recently used first. Changes nothing."""
        return list(self._blocks)

    @property
    def free(self) -> int:
        return self.capacity - len(self._blocks)

    def __contains__(self, h: int) -> bool:
        return h in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)
