"""The prefix index's interface: one contract, two backends.

`PrefixIndex` (routing/prefix/prefix_index.py) keeps the index in this process: the
router simulator, the benchmarks and `BatonRouter` use it. `RedisIndex`
(routing/prefix/redis_index.py) keeps it in Redis, where the KV indexer writes it
and every front reads it. tests/unit/test_index_contract.py runs the same
tests against both.

Hashes are Baton's chained, tenant-salted block hashes
(routing/prefix/block_hash.py). No Ray, torch or Redis imports here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from routing.prefix.prefix_index import IndexSnapshot

FANOUT_CAP = 16  # fan-outs are counted up to this many children


class KVIndex(ABC):
    """Which replica holds which KV block, and how many ways each block is continued."""

    # ---- updates ------------------------------------------------------------

    @abstractmethod
    def apply_stored(self, replica: str, block_hashes: Iterable[int], parent: int | None = None) -> None:
        """Records that `replica` holds `block_hashes`, consecutive blocks of one chain
        whose first follows `parent` (None at a prompt's start); each block becomes a
        child of the one before it, which raises that block's fan-out."""

    @abstractmethod
    def apply_removed(self, replica: str, block_hashes: Iterable[int]) -> None:
        """Records that `replica` evicted `block_hashes`. A hash the replica does not
        hold changes nothing. A block no replica holds any more is forgotten with
        its fan-out."""

    @abstractmethod
    def apply_cleared(self, replica: str) -> None:
        """Records that `replica` dropped every block, as `apply_removed` of all it
        holds. Queries see it as `remove_replica` leaves it: holding nothing and
        absent from `replicas()`; it may store again at once."""

    def remove_replica(self, replica: str) -> None:
        """Forgets `replica` (it died or left the pool); unknown replicas are ignored."""
        self.apply_cleared(replica)

    # ---- queries (change nothing) --------------------------------------------

    @abstractmethod
    def snapshot(self, block_hashes: Sequence[int]) -> IndexSnapshot:
        """The slice of the index one routing decision reads: the holders and
        fan-outs of `block_hashes`."""

    def match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """`{replica: n}`, n >= 1 the length of the leading run of `block_hashes`
        the replica holds; replicas holding none of the leading blocks are absent."""
        return self.snapshot(block_hashes).match(block_hashes)

    @abstractmethod
    def fanout(self, block_hash: int) -> int:
        """Distinct children recorded after `block_hash`, at most FANOUT_CAP. A child
        stays counted after it is evicted; the count goes only when `block_hash`
        itself is forgotten (see `apply_removed`)."""

    @abstractmethod
    def num_blocks(self, replica: str) -> int:
        """How many blocks `replica` holds."""

    @abstractmethod
    def replicas(self) -> list[str]:
        """The replicas that hold at least one block, in no particular order."""
