"""What a KV indexer knows beyond the index, kept in Redis so that its replacement resumes.

The index in Redis is keyed by Baton's block hashes, but engines remove blocks
by their own hashes, and the indexer applies each engine's batches by sequence
number. An indexer that started with neither had to replay every engine's
stream from batch 0; where the engine's replay buffer no longer reached back
that far, it forgot the replica, and the blocks the engine kept cached without
announcing them again stayed missing: the index under-predicted (`baton bench
chaos`, an indexer kill: 28 of 47 predictions exact in the window after it).

So the indexer writes, in the same pipeline as the index updates they go with
(routing/prefix/redis_index.py `RedisIndex.flush`), the translator's journal
(routing/prefix/event_translator.py) and, last, each touched replica's next
batch number and replay socket. Redis runs a pipeline's commands in order, so
a pipeline cut short leaves the saved numbers at or behind the saved index,
and replaying batches the index already has changes nothing. A new indexer
`load`s all of it and replays only its own outage.

Keys (prefix `baton:`):
- `idx:tr:{replica}` hash: engine hash (msgpack) -> [Baton hash, salt, Baton hash of its parent] (msgpack)
- `idx:trs`          hash: engine hash (msgpack) -> [Baton hash, [replicas that saved it]]
- `idx:seq`          hash: replica -> {"next": batch number, "replay": replay socket} (JSON)

Their writes cost, per flush, at most three commands for each key touched
(`coalesce`), on top of the index's: one command per event before, which was
18% of the indexer's time at 64 engines. They live and die with the index,
outside the append-only file as it is (routing/prefix/redis_index.py
`UNLOGGED`): a restarted Redis holds none of them, or the copy its last file
rewrite took of them and of the index together, and the indexer then
rewrites them with the index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import msgspec

from routing.prefix.event_translator import Op
from routing.prefix.redis_state import P

SEQ_KEY = f"{P}idx:seq"
STORE_KEY = f"{P}idx:trs"
CHUNK = 1000  # fields per command: a script's arguments are unpacked onto Lua's stack (8,000 at most)
_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()


def map_key(replica: str) -> str:
    return f"{P}idx:tr:{replica}"


@dataclass
class Saved:
    """What `load` found: per replica its next batch number, replay socket and map; the store's holdings."""

    seqs: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    maps: dict[str, dict[Any, tuple]] = field(default_factory=dict)  # as EventTranslator.restore takes them
    store: dict[Any, tuple[int, list[str]]] = field(default_factory=dict)


def coalesce(ops: list[Op]) -> dict[str, tuple[bool, dict, list]]:
    """The net effect of translator journal `ops`, in their order, per Redis key: whether the key is
    deleted first, then the fields it gets (encoded) and the fields it loses. A field set and then
    removed within `ops` is only removed, and a clear drops what came before it. Pure."""
    net: dict[str, list] = {}  # key -> [cleared, {engine hash: value, or None for removed}]
    for op in ops:
        kind = op[0]
        if kind == "clear":
            net[map_key(op[1])] = [True, {}]
            continue
        key, changes = (STORE_KEY, op[1]) if kind.startswith("store_") else (map_key(op[1]), op[2])
        fields = net.setdefault(key, [False, {}])[1]
        if kind.endswith("set"):
            fields.update(changes)
        else:
            fields.update(dict.fromkeys(changes))
    out = {}
    for key, (cleared, fields) in net.items():
        sets = {_enc.encode(h): _enc.encode(v) for h, v in fields.items() if v is not None}
        dels = [] if cleared else [_enc.encode(h) for h, v in fields.items() if v is None]
        out[key] = (cleared, sets, dels)
    return out


def unlogged_hset(index, pipe, key: str, mapping: dict) -> None:
    """Adds to `pipe` (None: sends at once) HSETs of `mapping` into `key`, CHUNK fields each,
    unlogged as the index is (`index`, a RedisIndex)."""
    flat = [x for kv in mapping.items() for x in kv]
    for i in range(0, len(flat), 2 * CHUNK):
        index.unlogged(pipe, "HSET", key, *flat[i:i + 2 * CHUNK])


def queue(index, pipe, ops: list[Op], positions: dict[str, tuple[int, str | None] | None]) -> None:
    """Adds to `pipe` the writes of translator journal `ops`, coalesced to a few commands per key
    (`coalesce`), then each replica's position in `positions` (None: the replica is forgotten, its
    entry deleted), all unlogged as the index is (`index`, a RedisIndex:
    routing/prefix/redis_index.py). Changes nothing itself."""
    def hset(key: str, mapping: dict) -> None:
        unlogged_hset(index, pipe, key, mapping)

    def hdel(key: str, fields: list) -> None:
        for i in range(0, len(fields), CHUNK):
            index.unlogged(pipe, "HDEL", key, *fields[i:i + CHUNK])

    for key, (cleared, sets, dels) in coalesce(ops).items():
        if cleared:
            index.unlogged(pipe, "DEL", key)
        if dels:
            hdel(key, dels)
        if sets:
            hset(key, sets)
    gone = [r for r, pos in positions.items() if pos is None]
    if gone:
        hdel(SEQ_KEY, gone)
    kept = {r: json.dumps({"next": pos[0], "replay": pos[1]}) for r, pos in positions.items() if pos is not None}
    if kept:
        hset(SEQ_KEY, kept)


def load(client) -> Saved:
    """Everything saved (sync client); reads only."""
    out = Saved()
    for name, raw in client.hgetall(SEQ_KEY).items():
        replica = name.decode() if isinstance(name, bytes) else name
        entry = json.loads(raw)
        out.seqs[replica] = (int(entry["next"]), entry.get("replay"))
        out.maps[replica] = {_dec.decode(h): tuple(_dec.decode(v))
                             for h, v in client.hgetall(map_key(replica)).items()}
    out.store = {_dec.decode(h): tuple(_dec.decode(v)) for h, v in client.hgetall(STORE_KEY).items()}
    return out
