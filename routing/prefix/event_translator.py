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


@dataclass
class EventTranslator:
    block_size: int
    hash_fn: BlockHashFn = default_block_hash
    journal: list[Op] | None = None  # where changes are appended, if anywhere (module docstring)
    # replica -> engine hash -> (baton hash, salt, the Baton hash of its parent or None)
    _maps: dict[str, dict[Any, tuple[int, str | None, int | None]]] = field(default_factory=dict)
    # engine hash -> (baton hash, replicas that saved it into the store and audit it there)
    _store: dict[Any, tuple[int, set[str]]] = field(default_factory=dict)

    def _log(self, op: Op) -> None:
        if self.journal is not None:
            self.journal.append(op)

    def restore(self, replica: str, entries: dict[Any, tuple]) -> None:
        """Sets `replica`'s map to `entries` (as a journal wrote them; a journal written before
        parents were kept gives none); journals nothing."""
        self._maps[replica] = {h: (v[0], v[1], v[2] if len(v) > 2 else None) for h, v in entries.items()}

    def restore_store(self, entries: dict[Any, tuple[int, Sequence[str]]]) -> None:
        """Sets the store holdings to `entries` (as a journal wrote them); journals nothing."""
        self._store = {h: (baton, set(saved_by)) for h, (baton, saved_by) in entries.items()}

    def replicas(self) -> list[str]:
        """Replicas with a map (announced blocks, or restored); changes nothing."""
        return sorted(self._maps)

    def stored(self, replica: str, engine_hashes: Sequence[Any], parent: Any,
               token_ids: Sequence[int], extra_keys: Sequence[Any] | None) -> Translated | None:
        """Translates a BlockStored with token ids; remembers the new hashes.

        Returns None when the event cannot be placed (unknown parent, or
        token ids that do not cover the blocks).
        """
        m = self._maps.setdefault(replica, {})
        if parent is not None and parent not in m:
            return None
        if len(token_ids) < len(engine_hashes) * self.block_size:
            return None
        baton_parent, salt = m[parent][:2] if parent is not None else (None, None)
        if parent is None:
            salt = salt_of(extra_keys[0]) if extra_keys else None
        n = len(engine_hashes) * self.block_size
        out = hash_blocks(token_ids[:n], self.block_size, salt, baton_parent, self.hash_fn)
        new = {eh: (h, salt, p) for eh, h, p in zip(engine_hashes, out, [baton_parent, *out[:-1]])}
        m.update(new)
        self._log(("set", replica, new))
        return Translated(out, baton_parent)

    def known(self, replica: str, engine_hashes: Sequence[Any]) -> list[int]:
        """Baton hashes of already-announced engine hashes (unknown ones skipped)."""
        m = self._maps.get(replica, {})
        return [m[h][0] for h in engine_hashes if h in m]

    def store_stored(self, replica: str, engine_hashes: Sequence[Any]) -> list[int]:
        """Baton hashes of blocks `replica` saved into the store (hashes it never announced are
        skipped); remembers them as store holdings that `replica` vouches for."""
        m = self._maps.get(replica, {})
        out: list[int] = []
        changed = {}
        for h in engine_hashes:
            if h in self._store:
                if replica not in self._store[h][1]:
                    self._store[h][1].add(replica)
                    changed[h] = self._store[h]
                out.append(self._store[h][0])
            elif h in m:
                self._store[h] = changed[h] = (m[h][0], {replica})
                out.append(m[h][0])
        if changed:
            self._log(("store_set", {h: (baton, sorted(by)) for h, (baton, by) in changed.items()}))
        return out

    def store_removed(self, engine_hashes: Sequence[Any]) -> list[int]:
        """Baton hashes of store blocks that no tier holds any more; forgets them."""
        gone = list(dict.fromkeys(h for h in engine_hashes if h in self._store))
        if gone:
            self._log(("store_del", gone))
        return [self._store.pop(h)[0] for h in gone]

    def store_forget(self, replica: str) -> list[int]:
        """Drops `replica` as a witness of store holdings; returns (and forgets) the Baton
        hashes no other replica vouches for, since nobody would report their eviction."""
        out: list[int] = []
        gone, kept = [], {}
        for h, (baton, saved_by) in list(self._store.items()):
            if replica not in saved_by:
                continue
            saved_by.discard(replica)
            if saved_by:
                kept[h] = (baton, sorted(saved_by))
            else:
                del self._store[h]
                gone.append(h)
                out.append(baton)
        if kept:
            self._log(("store_set", kept))
        if gone:
            self._log(("store_del", gone))
        return out

    def holdings(self, replica: str) -> set[int]:
        """Baton hashes of every block `replica` announced and still holds; changes nothing."""
        return {v[0] for v in self._maps.get(replica, {}).values()}

    def parents(self, replica: str) -> dict[int, int | None]:
        """Baton hash -> its parent's Baton hash (None: a prompt's first block, or not known) of
        every block `replica` holds; changes nothing."""
        return {v[0]: v[2] for v in self._maps.get(replica, {}).values()}

    def store_holdings(self) -> set[int]:
        """Baton hashes of every block the store holds; changes nothing."""
        return {baton for baton, _ in self._store.values()}

    def rejournal(self, replica: str) -> None:
        """Journals `replica`'s whole map again (a clear, then every entry) and the store holdings
        it vouches for, as they are now: for a journal lost with a write that failed."""
        self._log(("clear", replica))
        self._log(("set", replica, dict(self._maps.get(replica, {}))))
        vouched = {h: (baton, sorted(by)) for h, (baton, by) in self._store.items() if replica in by}
        if vouched:
            self._log(("store_set", vouched))

    def removed(self, replica: str, engine_hashes: Sequence[Any]) -> list[int]:
        """Baton hashes of removed blocks; forgets them for `replica`."""
        m = self._maps.get(replica, {})
        gone = list(dict.fromkeys(h for h in engine_hashes if h in m))
        if gone:
            self._log(("del", replica, gone))
        return [m.pop(h)[0] for h in gone]

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
