"""Engine KV events in Baton's block hashes.

vLLM publishes `BlockStored` with its own block hashes, the parent's hash, the
blocks' token ids and (for the first block of a request) the cache salt in
`extra_keys`. Baton's index keys blocks by `block_hash.hash_blocks` of the
same token ids and salt, so the router, which hashes the prompt itself,
and the engines can never disagree on what a block is: same tokens, same
block size, same tenant salt, same hash. `BlockRemoved` carries only engine
hashes, so the translator remembers each replica's engine hash -> Baton hash.

Store events (Mooncake, medium "cpu") carry no token ids; their engine hashes
are those the same prefill engine already announced for its own cache, so
they are translated through that replica's map. Store holdings outlive the
engine's own copy, so the translator keeps them in a map of their own until
the store reports them gone (kvstore/holdings.py) or no replica that saved
them is left to report it.

With a `journal` list, every change to the maps is also appended to it as an
op (`Op`), which the KV indexer writes to Redis with the index itself
(deployments/kv_index/indexer_state.py), so that an indexer that replaces it
resumes with the same maps (`restore`, `restore_store`).

Pure: no I/O; each call says what it changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from routing.prefix.block_hash import BlockHashFn, hash_blocks, default_block_hash


@dataclass
class Translated:
    """Baton hashes of one event's blocks, chained from `parent` (None = prompt start)."""

    hashes: list[int]
    parent: int | None


def salt_of(extra_keys: Any) -> str | None:
    """The cache salt inside one block's vLLM extra keys (the plain string entry)."""
    if not extra_keys:
        return None
    for key in extra_keys:
        if isinstance(key, str):
            return key
    return None


# A journal op: ("set", replica, {engine hash: (baton hash, salt, baton parent)}), ("del", replica, [engine
# hashes]), ("clear", replica), ("store_set", {engine hash: (baton hash, [replicas])}) or
# ("store_del", [engine hashes]).
Op = tuple


class BlockMap:
    """One replica's engine hash -> (Baton hash, salt, the Baton hash of its parent or None), as
    three dicts of ints and strings: Python's cyclic collector tracks none of them. A tuple per
    block made each dict one it traverses again after every change: at 64 engines' full KV (1.8M
    blocks) the maps were 112 ms of every full collection of the indexer's process, and the store
    holdings' sets the rest of its 265-271 ms (`baton bench scale --part control --only heap`)."""

    __slots__ = ("baton", "salt", "parent")

    def __init__(self, entries: dict[Any, tuple] | None = None) -> None:
        self.baton: dict[Any, int] = {}
        self.salt: dict[Any, str | None] = {}
        self.parent: dict[Any, int | None] = {}
        if entries:
            self.update(entries)

    def __contains__(self, h: Any) -> bool:
        return h in self.baton

    def update(self, entries: dict[Any, tuple]) -> None:
        """Sets each engine hash's (Baton hash, salt[, parent]) (a journal written before parents
        were kept gives none)."""
        for h, v in entries.items():
            self.baton[h], self.salt[h], self.parent[h] = v[0], v[1], v[2] if len(v) > 2 else None

    def add(self, engine_hashes: Sequence[Any], batons: Sequence[int], salt: str | None,
            parents: Sequence[int | None]) -> None:
        """Sets the blocks of one event: engine hash i -> (batons[i], salt, parents[i])."""
        self.baton.update(zip(engine_hashes, batons))
        self.salt.update(dict.fromkeys(engine_hashes, salt))
        self.parent.update(zip(engine_hashes, parents))

    def pop(self, h: Any) -> int:
        """Forgets `h`; returns its Baton hash."""
        del self.salt[h], self.parent[h]
        return self.baton.pop(h)

    def entries(self) -> dict[Any, tuple[int, str | None, int | None]]:
        """Every engine hash's (Baton hash, salt, parent), as the journal writes them."""
        salt, parent = self.salt, self.parent
        return {h: (b, salt[h], parent[h]) for h, b in self.baton.items()}


@dataclass
class EventTranslator:
    block_size: int
    hash_fn: BlockHashFn = default_block_hash
    journal: list[Op] | None = None  # where changes are appended, if anywhere (module docstring)
    _maps: dict[str, BlockMap] = field(default_factory=dict)  # replica -> its blocks
    # engine hash -> Baton hash, and a mask of the replicas that saved it into the store and audit
    # it there (`_bits`): ints, which the collector does not track, not a set per block
    _store: dict[Any, int] = field(default_factory=dict)
    _saved_by: dict[Any, int] = field(default_factory=dict)
    _bits: dict[str, int] = field(default_factory=dict)  # replica -> its bit in `_saved_by`
    _named: dict[int, list[str]] = field(default_factory=dict)  # `_names`' answers while `_bits` holds

    def _bit(self, replica: str) -> int:
        bit = self._bits.get(replica)
        if bit is None:
            taken = sum(self._bits.values())  # distinct powers of two
            bit = self._bits[replica] = ~taken & (taken + 1)  # the lowest free bit
            self._named.clear()
        return bit

    def _names(self, mask: int) -> list[str]:
        """The replicas of `mask`, sorted (a new list)."""
        named = self._named.get(mask)
        if named is None:
            named = self._named[mask] = sorted(r for r, b in self._bits.items() if b & mask)
        return list(named)

    def _log(self, op: Op) -> None:
        if self.journal is not None:
            self.journal.append(op)

    def restore(self, replica: str, entries: dict[Any, tuple]) -> None:
        """Sets `replica`'s map to `entries` (as a journal wrote them; a journal written before
        parents were kept gives none); journals nothing."""
        self._maps[replica] = BlockMap(entries)

    def restore_store(self, entries: dict[Any, tuple[int, Sequence[str]]]) -> None:
        """Sets the store holdings to `entries` (as a journal wrote them); journals nothing."""
        self._store = {h: baton for h, (baton, _) in entries.items()}
        self._saved_by = {}
        for h, (_, saved_by) in entries.items():
            mask = 0
            for r in saved_by:
                mask |= self._bit(r)
            self._saved_by[h] = mask

    def replicas(self) -> list[str]:
        """Replicas with a map (announced blocks, or restored); changes nothing."""
        return sorted(self._maps)

    def stored(self, replica: str, engine_hashes: Sequence[Any], parent: Any,
               token_ids: Sequence[int], extra_keys: Sequence[Any] | None) -> Translated | None:
        """Translates a BlockStored with token ids; remembers the new hashes.

        Returns None when the event cannot be placed (unknown parent, or
        token ids that do not cover the blocks).
        """
        m = self._maps.get(replica)
        if m is None:
            m = self._maps[replica] = BlockMap()
        if parent is not None and parent not in m:
            return None
        if len(token_ids) < len(engine_hashes) * self.block_size:
            return None
        baton_parent, salt = (m.baton[parent], m.salt[parent]) if parent is not None else (None, None)
        if parent is None:
            salt = salt_of(extra_keys[0]) if extra_keys else None
        n = len(engine_hashes) * self.block_size
        out = hash_blocks(token_ids[:n], self.block_size, salt, baton_parent, self.hash_fn)
        parents = [baton_parent, *out[:-1]]
        m.add(engine_hashes, out, salt, parents)
        if self.journal is not None:
            self._log(("set", replica, {eh: (h, salt, p) for eh, h, p in zip(engine_hashes, out, parents)}))
        return Translated(out, baton_parent)

    def known(self, replica: str, engine_hashes: Sequence[Any]) -> list[int]:
        """Baton hashes of already-announced engine hashes (unknown ones skipped)."""
        batons = self._maps[replica].baton if replica in self._maps else {}
        return [batons[h] for h in engine_hashes if h in batons]

    def store_stored(self, replica: str, engine_hashes: Sequence[Any]) -> list[int]:
        """Baton hashes of blocks `replica` saved into the store (hashes it never announced are
        skipped); remembers them as store holdings that `replica` vouches for."""
        batons = self._maps[replica].baton if replica in self._maps else {}
        store, saved_by, bit = self._store, self._saved_by, self._bit(replica)
        out: list[int] = []
        changed = []
        for h in engine_hashes:
            if h in store:
                if not saved_by[h] & bit:
                    saved_by[h] |= bit
                    changed.append(h)
                out.append(store[h])
            elif h in batons:
                store[h], saved_by[h] = batons[h], bit
                changed.append(h)
                out.append(store[h])
        if changed:
            self._log(("store_set", {h: (store[h], self._names(saved_by[h])) for h in changed}))
        return out

    def store_removed(self, engine_hashes: Sequence[Any]) -> list[int]:
        """Baton hashes of store blocks that no tier holds any more; forgets them."""
        gone = list(dict.fromkeys(h for h in engine_hashes if h in self._store))
        if gone:
            self._log(("store_del", gone))
        for h in gone:
            del self._saved_by[h]
        return [self._store.pop(h) for h in gone]

    def store_forget(self, replica: str) -> list[int]:
        """Drops `replica` as a witness of store holdings; returns (and forgets) the Baton
        hashes no other replica vouches for, since nobody would report their eviction."""
        out: list[int] = []
        gone, kept = [], {}
        bit = self._bits.pop(replica, 0)  # free for the next replica: no block keeps it
        self._named.clear()
        for h, by in list(self._saved_by.items()):
            if not by & bit:
                continue
            by &= ~bit
            if by:
                self._saved_by[h] = by
                kept[h] = (self._store[h], self._names(by))
            else:
                del self._saved_by[h]
                gone.append(h)
                out.append(self._store.pop(h))
        if kept:
            self._log(("store_set", kept))
        if gone:
            self._log(("store_del", gone))
        return out

    def holdings(self, replica: str) -> set[int]:
        """Baton hashes of every block `replica` announced and still holds; changes nothing."""
        return set(self._maps[replica].baton.values()) if replica in self._maps else set()

    def parents(self, replica: str) -> dict[int, int | None]:
        """Baton hash -> its parent's Baton hash (None: a prompt's first block, or not known) of
        every block `replica` holds; changes nothing."""
        m = self._maps.get(replica)
        return {} if m is None else {b: m.parent[h] for h, b in m.baton.items()}

    def store_holdings(self) -> set[int]:
        """Baton hashes of every block the store holds; changes nothing."""
        return set(self._store.values())

    def rejournal(self, replica: str) -> None:
        """Journals `replica`'s whole map again (a clear, then every entry) and the store holdings
        it vouches for, as they are now: for a journal lost with a write that failed."""
        self._log(("clear", replica))
        self._log(("set", replica, self._maps[replica].entries() if replica in self._maps else {}))
        bit = self._bits.get(replica, 0)
        vouched = {h: (self._store[h], self._names(by)) for h, by in self._saved_by.items() if by & bit}
        if vouched:
            self._log(("store_set", vouched))

    def removed(self, replica: str, engine_hashes: Sequence[Any]) -> list[int]:
        """Baton hashes of removed blocks; forgets them for `replica`."""
        m = self._maps.get(replica)
        gone = list(dict.fromkeys(h for h in engine_hashes if h in m)) if m is not None else []
        if gone:
            self._log(("del", replica, gone))
        return [m.pop(h) for h in gone]

    def cleared(self, replica: str) -> None:
        """Forgets everything `replica` announced."""
        self._maps.pop(replica, None)
        self._log(("clear", replica))


def chains(blocks: set[int], parents: dict[int, int | None]) -> list[tuple[int | None, list[int]]]:
    """`blocks` as parent-linked chains, each (the parent of its first block, its blocks in
    order), every block in exactly one: what `apply_stored` takes, in as few calls as the tree's
    branches allow. A block whose parent is not in `blocks` (or unknown) starts a chain. Pure."""
    children: dict[int, list[int]] = {}
    for h in sorted(blocks):
        p = parents.get(h)
        if p in blocks and p != h:
            children.setdefault(p, []).append(h)
    out: list[tuple[int | None, list[int]]] = []
    todo = [(parents.get(h), h) for h in sorted(blocks, reverse=True)
            if parents.get(h) not in blocks or parents.get(h) == h]
    seen: set[int] = set()
    while todo:
        parent, h = todo.pop()
        chain: list[int] = []
        while h is not None and h not in seen:
            seen.add(h)
            chain.append(h)
            kids = [k for k in children.get(h, []) if k not in seen]
            todo.extend((h, k) for k in reversed(kids[1:]))
            h = kids[0] if kids else None
        if chain:
            out.append((parent, chain))
    out.extend((parents.get(h), [h]) for h in sorted(blocks - seen))  # a cycle, which no engine makes
    return out
