"""Exact prefix index: which replica holds which KV block hash.

The index is fed by the engines' KV cache events (vLLM ``BlockStored``,
``BlockRemoved``, ``AllBlocksCleared``), so it mirrors what each replica
really holds rather than guessing from routing history.

Layout: ``block hash -> bit mask of the replicas holding it`` (each replica
known to the index has a bit of its own) plus ``replica -> its hashes`` for
cheap removal of a whole replica. The index also records each block's
*fan-out*: how many distinct child blocks were stored after it (capped at
``fanout_cap``). A shared system prompt or template has a high fan-out (every
conversation continues it differently); a conversation's own blocks have one
or two children. The policy uses this to tell shared heads from specific
tails. A query walks the prompt's blocks once
and intersects the shrinking mask of replicas still matching, so its cost is
O(prompt blocks + replicas holding the first block), independent of how many
blocks the fleet holds.

Ints in dicts, not a set per block: Python's cyclic collector traverses every
set and every dict that holds one, while a dict of ints alone is not its to
track. With a set of holders and one of children per block, a front's copy of
a 64-engine index at full KV (1.8M blocks) was 2.9M objects for it, and each
full collection stopped the front for ~0.8 s; with masks, first children and
each replica's blocks as a dict of ints, it adds none, and it takes a third of
the memory (`baton bench scale --part control --only heap`;
tests/unit/test_routing_prefix_index.py keeps it out of the collector's sight).

``IndexSnapshot`` is a PrefixIndex holding only one prompt's blocks, as one
round trip fetched them (routing/prefix/redis_index.py) or ``PrefixIndex.snapshot``
copied them: what the policy reads for one decision.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from itertools import islice

from routing.prefix.index_api import FANOUT_CAP, KVIndex


class PrefixIndex(KVIndex):
    """Block hash -> replicas holding it, in this process (the KVIndex contract). Pure,
    not thread-safe."""

    def __init__(self, fanout_cap: int = FANOUT_CAP) -> None:
        self.fanout_cap = fanout_cap
        self._holders: dict[int, int] = {}  # block hash -> mask of the holders' bits
        self._held: dict[str, dict[int, None]] = {}  # replica -> the hashes it holds (a dict: untracked)
        self._child: dict[int, int] = {}  # block hash -> the first child seen after it
        self._more: dict[int, set[int]] = {}  # block hash -> its other distinct children, up to the cap (few)
        self._bit: dict[str, int] = {}  # replica -> its bit (a power of two)
        self._name: dict[int, str] = {}  # bit -> replica

    # ---- updates (each changes the index) ---------------------------------

    def apply_stored(self, replica: str, block_hashes: Iterable[int], parent: int | None = None) -> None:
        """Record that ``replica`` now holds ``block_hashes``.

        ``block_hashes`` are consecutive blocks of one chain and ``parent`` is
        the hash before the first (None at the start of a prompt), as in
        vLLM's ``BlockStored``. Hashes are chained, so prefix queries need no
        parent link; the links feed the blocks' fan-out.
        """
        bit = self._bit.get(replica) or self._join(replica)
        held, holders, child = self._held[replica], self._holders, self._child
        prev = parent
        for h in block_hashes:
            if prev is not None:
                first = child.setdefault(prev, h)
                if first != h:
                    self._branch(prev, h)
            prev = h
            held[h] = None
            holders[h] = holders.get(h, 0) | bit

    def _branch(self, parent: int, h: int) -> None:
        """Counts `h` among `parent`'s children after its first, up to the fan-out cap."""
        more = self._more.get(parent)
        if more is None:
            if self.fanout_cap > 1:
                self._more[parent] = {h}
        elif len(more) < self.fanout_cap - 1:
            more.add(h)

    def _join(self, replica: str) -> int:
        """Gives a replica new to the index the lowest free bit and no blocks."""
        free = ~sum(self._name)  # the known replicas' bits, each a distinct power of two
        bit = free & -free
        self._bit[replica], self._name[bit] = bit, replica
        self._held[replica] = {}
        return bit

    def restore_children(self, parent: int, children: Iterable[int]) -> None:
        """Records `children` as blocks seen after `parent` (up to the fan-out cap), as a copy of
        another index's fan-out is loaded; changes only `parent`'s fan-out."""
        for h in children:
            if self._child.setdefault(parent, h) != h:
                self._branch(parent, h)

    def apply_removed(self, replica: str, block_hashes: Iterable[int]) -> None:
        """Record that ``replica`` evicted ``block_hashes``. Unknown hashes are ignored."""
        held = self._held.get(replica)
        if held is None:
            return
        bit = self._bit[replica]
        for h in block_hashes:
            if h in held:
                del held[h]
                self._drop_holder(h, bit)

    def apply_cleared(self, replica: str) -> None:
        """Record that ``replica`` dropped every block; it stays known (empty)."""
        if replica not in self._held:
            return
        bit = self._bit[replica]
        for h in self._held[replica]:
            self._drop_holder(h, bit)
        self._held[replica] = {}

    def remove_replica(self, replica: str) -> None:
        """Forget ``replica`` entirely (it died or left the pool); unknown replicas are ignored.
        Its bit, cleared from every block, goes to the next replica that joins."""
        if replica not in self._held:
            return
        self.apply_cleared(replica)
        del self._held[replica]
        bit = self._bit.pop(replica)
        del self._name[bit]

    def snapshot(self, block_hashes: Sequence[int]):
        """An IndexSnapshot of ``block_hashes`` (what the Redis backend hands the policy)."""
        return IndexSnapshot(block_hashes, [set(self._names(self._holders.get(h, 0))) for h in block_hashes],
                             [self.fanout(h) for h in block_hashes])

    # ---- queries (change nothing) -----------------------------------------

    def match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Return ``{replica: n}`` where n >= 1 is the length of the leading run
        of ``block_hashes`` that the replica holds. Replicas holding none of
        the leading blocks are absent."""
        result: dict[str, int] = {}
        if not block_hashes:
            return result
        holders = self._holders
        active = holders.get(block_hashes[0], 0)  # the replicas holding every block so far
        if not active:
            return result
        n, total = 1, len(block_hashes)  # n: leading blocks every replica in ``active`` holds
        if active & (active - 1):  # more than one replica
            while n < total:
                held_by = holders.get(block_hashes[n], 0)
                if held_by != active and (gone := active & ~held_by):  # (most blocks: the same holders)
                    for r in self._names(gone):
                        result[r] = n
                    active ^= gone
                    if not active:
                        return result
                    if not active & (active - 1):  # one left: it holds this block too
                        n += 1
                        break
                n += 1
        if not active & (active - 1):  # a conversation's own blocks, on one replica: its held set alone
            held = self._held[self._name[active]]  # (a third of the per-block cost above)
            for h in islice(block_hashes, n, None):
                if h not in held:
                    break
                n += 1
        for r in self._names(active):
            result[r] = n
        return result

    def _names(self, mask: int) -> list[str]:
        """The replicas whose bits are in `mask`: bit by bit where they are few, else by a scan of
        every replica's bit (the 63 a conversation's first own block leaves behind)."""
        if mask.bit_count() * 4 > len(self._name):
            return [r for bit, r in self._name.items() if bit & mask]
        out, name = [], self._name
        while mask:
            low = mask & -mask
            out.append(name[low])
            mask ^= low
        return out

    def known_blocks(self) -> Container[int]:
        """The hashes some replica holds, as a live view for `in` tests (no copy)."""
        return self._holders.keys()

    def fanout(self, block_hash: int) -> int:
        """Distinct child blocks seen after ``block_hash`` (at most ``fanout_cap``)."""
        return (block_hash in self._child) + len(self._more.get(block_hash, ()))

    def shared_prefix_len(self, block_hashes: Sequence[int], min_fanout: int, start: int = 0) -> int:
        """The part of the prompt many conversations share, in blocks (`shared_head` of the
        blocks' fan-outs from block `start` on: the caller knows the blocks before it are shared,
        and reads none of them; 0 where no shared head is found from there). Changes nothing."""
        return shared_head(map(self.fanout, islice(block_hashes, start, None)), min_fanout, start)

    def num_holders(self, block_hash: int) -> int:
        """How many replicas hold ``block_hash``."""
        return self._holders.get(block_hash, 0).bit_count()

    def holds(self, replica: str, block_hash: int) -> bool:
        """Whether ``replica`` holds ``block_hash``."""
        return block_hash in self._held.get(replica, ())

    def num_blocks(self, replica: str) -> int:
        """How many blocks ``replica`` holds according to the index."""
        return len(self._held.get(replica, ()))

    def replicas(self) -> list[str]:
        """Replicas holding at least one block, in the order the index first heard of them."""
        return [r for r, held in self._held.items() if held]

    def _drop_holder(self, h: int, bit: int) -> None:
        mask = self._holders.get(h)
        if mask is None:
            return
        mask &= ~bit
        if mask:
            self._holders[h] = mask
        else:
            del self._holders[h]
            self._child.pop(h, None)
            self._more.pop(h, None)


class IndexSnapshot(PrefixIndex):
    """A PrefixIndex holding only the blocks of one prompt, as fetched."""

    def __init__(self, block_hashes: Sequence[int], holders: Sequence[set[str]],
                 fanouts: Sequence[int]) -> None:
        super().__init__()
        for h, replicas in zip(block_hashes, holders):
            for r in replicas:
                self.apply_stored(r, [h])
        self._fanouts = dict(zip(block_hashes, fanouts))

    def fanout(self, block_hash: int) -> int:
        return self._fanouts.get(block_hash, 0)


def shared_head(fanouts: Iterable[int], min_fanout: int, start: int = 0) -> int:
    """How many leading blocks a prompt shares with many conversations, from the fan-outs of its
    blocks from block `start` on, counted from the prompt's first block: up to the last of the
    first run of blocks with a fan-out of at least `min_fanout`, reached through blocks with one
    child each. A system prompt of 128 blocks has one child
    after each of its blocks but the last, which every conversation continues differently: all
    128 are shared (a run of high fan-outs alone, as this was until 2026-12-05, found none of
    it at 16-token blocks). 0 when no such block comes before a block with no child or a few."""
    n = last = 0
    for k in fanouts:
        if k >= min_fanout:
            n += 1
            last = n
        elif last or k != 1:
            break
        else:
            n += 1
    return start + last if last else 0
