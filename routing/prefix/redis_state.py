"""Routing state shared through Redis: KV index, session pins, replica registry.

Keys (prefix `baton:`):
- `idx:h:{hash}`   set of replicas holding a block (Baton hash, tenant-salted)
- `idx:r:{replica}` set of blocks a replica holds (to clear it at once)
- `idx:c:{hash}`   set of child blocks seen after a block (its fan-out)
- `pin:{pool}:{session}` replica id, with the pin TTL
- `replicas:{pool}` hash replica id -> JSON {capacity_blocks, url, ts}
- `inflight:{pool}` hash `{replica} {front}` -> requests that front has in flight there
  (`inflight_work:{pool}` the same for queued prefill blocks); `...:sum` hashes
  replica -> the live fronts' total (deployments/front/shared_view.py)
- `idx:feed` a channel: the index's updates, as the indexer writes them (deployments/kv_index/index_feed.py)
- `idx:tr:*`, `idx:trs`, `idx:seq` the indexer's own state, so that its replacement resumes
  (deployments/kv_index/indexer_state.py)
- `sessions:{pool}:{replica}` sorted set session -> when it was last routed there
- `placements:{pool}` counter: one ticket per session placed (fronts take turns by it)

`RedisIndex` is the KVIndex contract (routing/prefix/index_api.py) over these keys.
The KV indexer is the only writer of `idx:*`; a front without its own copy of
the index reads one request's slice (`queue_snapshot`, `snapshot_from`) in the
same pipeline as the pins, and writes pins with `pin_key`.

The index and the indexer's own state (`idx:*`, the epoch) are written without
entering Redis's append-only file (`UNLOGGED`; Lua's `redis.set_repl`): they are
most of Redis's writes (at 64 engines, ~30k blocks stored and ~25k removed a
second), and with `redis.appendfsync: always` each of them waited for an fsync,
where a lost index costs only its rebuild from the indexer's own maps. A
restarted Redis therefore holds no index, or the stale one its last file
rewrite copied; the indexer tells the restart by Redis's run id and rewrites
the index (deployments/kv_index/kv_indexer.py `_check_redis`).
"""

from __future__ import annotations

import json
import time
from typing import Iterable, Sequence

from routing.prefix.index_api import FANOUT_CAP, KVIndex
from routing.prefix.prefix_index import IndexSnapshot

P = "baton:"
INDEXER_STATS_KEY = f"{P}indexer:stats"  # hash: the KV indexer's totals (deployments/kv_index/kv_indexer.py)
INDEX_EPOCH_KEY = f"{P}indexer:epoch"  # set while Redis holds an index; unlogged with it, so a restart drops it


# The first lines of every script that writes the index: its writes stay out of the append-only
# file (and replicas). Redis before 7 needs effects replication switched on for that.
_NO_AOF = """
if redis.replicate_commands then redis.replicate_commands() end
redis.set_repl(redis.REPL_NONE)
"""

# One write of any command, not logged (module docstring): KEYS[1] the key, ARGV[1] the command,
# ARGV[2..] its other arguments.
UNLOGGED = _NO_AOF + """
return redis.call(ARGV[1], KEYS[1], unpack(ARGV, 2))
"""

# apply_removed's script: KEYS[1] the replica's block set, ARGV[1] the replica, ARGV[2..] block hashes.
_REMOVE = _NO_AOF + """
local replica = ARGV[1]
for i = 2, #ARGV do
  local h = ARGV[i]
  local was = redis.call('SREM', KEYS[1], h)
  local hk = '""" + P + """idx:h:' .. h
  redis.call('SREM', hk, replica)
  if was == 1 and redis.call('EXISTS', hk) == 0 then
    redis.call('DEL', '""" + P + """idx:c:' .. h)
  end
end
return 0
"""


# apply_stored's script: KEYS[1] the replica's block set, ARGV[1] the replica, ARGV[2] the parent
# block ('' for none), ARGV[3..] the stored blocks in chain order. One call per event, not two
# commands per block: the indexer's time went to packing and sending those commands.
_STORE = _NO_AOF + """
local replica, prev = ARGV[1], ARGV[2]
for i = 3, #ARGV do
  local h = ARGV[i]
  redis.call('SADD', '""" + P + """idx:h:' .. h, replica)
  if prev ~= '' then
    redis.call('SADD', '""" + P + """idx:c:' .. prev, h)
  end
  prev = h
end
for i = 3, #ARGV, 1000 do
  redis.call('SADD', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
return 0
"""


def _h(h: int) -> str:
    return f"{P}idx:h:{h}"


def _c(h: int) -> str:
    return f"{P}idx:c:{h}"


def _r(replica: str) -> str:
    return f"{P}idx:r:{replica}"


class RedisIndex(KVIndex):
    """The KVIndex contract over Redis (sync client; one pipeline per update).

    The KV indexer is its only writer. Fronts read a request's slice with
    `queue_snapshot`/`snapshot_from` inside their own pipeline, which is
    what `snapshot` does on its own.
    """

    def __init__(self, client) -> None:
        self.r = client
        self._batch = None  # an open pipeline while the writer batches (`begin`/`flush`)
        self._remove = client.register_script(_REMOVE)
        self._store = client.register_script(_STORE)
        self._unlogged = client.register_script(UNLOGGED)

    def unlogged(self, pipe, command: str, key: str, *args):
        """Runs (or queues, on a pipeline) `command key *args` on `pipe`, or on the client where
        `pipe` is None, without logging it to the append-only file (module docstring); what the
        command changes, it changes in Redis's memory only."""
        return self._unlogged(keys=[key], args=[command, *args], client=pipe if pipe is not None else self.r)

    def begin(self) -> None:
        """Queues every later update in one pipeline until `flush`: the KV indexer applies all the
        events waiting on its socket in one round trip. Updates take effect in their order."""
        if self._batch is None:
            self._batch = self.r.pipeline(transaction=False)

    def flush(self, publish: tuple[str, bytes] | None = None, then=None) -> None:
        """Sends the queued updates (if any) and ends the batch. `then(pipe)` queues more commands
        after them (the indexer's own state, deployments/kv_index/indexer_state.py) and
        `publish`, a (channel, message), goes last (deployments/kv_index/index_feed.py), all in
        the same round trip."""
        pipe, self._batch = self._batch, None
        if pipe is None:
            pipe = self.r.pipeline(transaction=False)
        if then is not None:
            then(pipe)
        if publish:
            pipe.publish(*publish)
        if len(pipe):
            pipe.execute()

    def _send(self, pipe) -> None:
        if pipe is not self._batch:
            pipe.execute()

    def apply_stored(self, replica: str, block_hashes: Iterable[int], parent: int | None = None) -> None:
        """One script call: each block gets the replica as a holder and is its predecessor's child
        (`parent`'s for the first), and joins the replica's block set."""
        hashes = list(block_hashes)
        if not hashes:
            return
        pipe = self._batch if self._batch is not None else self.r.pipeline(transaction=False)
        self._store(keys=[_r(replica)], args=[replica, "" if parent is None else parent, *hashes], client=pipe)
        self._send(pipe)

    def apply_removed(self, replica: str, block_hashes: Iterable[int]) -> None:
        """One script call: only blocks the replica held count (removing one it never held changes
        nothing, even where nobody holds it: its recorded fan-out stays); a block nobody holds any
        more loses its fan-out too, as in PrefixIndex."""
        hashes = list(block_hashes)
        if not hashes:
            return
        pipe = self._batch if self._batch is not None else self.r.pipeline(transaction=False)
        self._remove(keys=[_r(replica)], args=[replica, *hashes], client=pipe)
        self._send(pipe)

    def apply_cleared(self, replica: str) -> None:
        if self._batch is not None:  # the replica's set must include what the batch stored
            self.flush()
            self.begin()
        self.apply_removed(replica, [int(h) for h in self.r.smembers(_r(replica))])
        self.unlogged(self._batch, "DEL", _r(replica))  # in a batch: after the removal, in its order

    def snapshot(self, block_hashes: Sequence[int]) -> IndexSnapshot:
        pipe = self.r.pipeline(transaction=False)
        queue_snapshot(pipe, block_hashes)
        return snapshot_from(block_hashes, pipe.execute())

    def fanout(self, block_hash: int) -> int:
        return min(FANOUT_CAP, self.r.scard(_c(block_hash)))

    def num_blocks(self, replica: str) -> int:
        return self.r.scard(_r(replica))

    def held(self, replica: str) -> set[int]:
        """The blocks the index says `replica` holds, read now (not through an open batch);
        changes nothing."""
        return {int(h) for h in self.r.smembers(_r(replica))}

    def replicas(self) -> list[str]:
        prefix = len(_r(""))
        names = (k.decode() if isinstance(k, bytes) else k for k in self.r.scan_iter(_r("*"), count=1000))
        return sorted(k[prefix:] for k in names)


IndexWriter = RedisIndex  # the KV indexer's name for it


def queue_snapshot(pipe, block_hashes: Sequence[int]) -> None:
    """Adds the reads of `snapshot_from` to a pipeline (2 commands per block)."""
    for h in block_hashes:
        pipe.smembers(_h(h))
    for h in block_hashes:
        pipe.scard(_c(h))


def snapshot_from(block_hashes: Sequence[int], results: Sequence) -> IndexSnapshot:
    """The IndexSnapshot from the results of `queue_snapshot`."""
    n = len(block_hashes)
    holders = [{m.decode() if isinstance(m, bytes) else m for m in s} for s in results[:n]]
    return IndexSnapshot(block_hashes, holders, [min(FANOUT_CAP, f) for f in results[n:2 * n]])


def pin_key(pool: str, session: str) -> str:
    return f"{P}pin:{pool}:{session}"


def registry_key(pool: str) -> str:
    return f"{P}replicas:{pool}"


def inflight_key(pool: str) -> str:
    return f"{P}inflight:{pool}"


def work_key(pool: str) -> str:
    """Prefill blocks each front has sent to each replica and not yet seen computed
    (fields as `inflight_field`): the queue the router's cost prices."""
    return f"{P}inflight_work:{pool}"


def sessions_key(pool: str, replica: str) -> str:
    return f"{P}sessions:{pool}:{replica}"


def placement_key(pool: str) -> str:
    return f"{P}placements:{pool}"


def sum_key(counts_key: str) -> str:
    """The hash of per-replica sums over every live front's fields of `counts_key` (inflight_key or
    work_key): what a routing read takes, kept by each front's increments and by `RECOUNT`."""
    return f"{counts_key}:sum"


# Places a session that has no live pin, atomically, so that fronts placing a burst of
# sessions at once each see the ones placed before: takes a ticket from the pool's counter
# (KEYS[1]), counts in each replica's set (KEYS[2..], in replica order) the sessions whose pins
# have not expired (score ARGV[2], the oldest live one, or later), and adds the
# session (ARGV[1], score ARGV[3], set TTL ARGV[4] ms) to the replica with the fewest, ties in
# turn by ticket: the rule of BatonPolicy._cold_choice (routing/policy/policy.py), which then
# makes the choice itself among the replicas under the overload bound. Expired sessions leave the
# set the session joins and one more set in turn by ticket, so every set is swept once in n
# placements (sweeping all n each time doubled the script's Redis time at 64 replicas). Returns
# the ticket, the 0-based index of the replica it went to, and the counts before it. A front's
# decision runs it (deployments/front/request_routing.py).
PLACE = """
local ticket = redis.call('INCR', KEYS[1])
local n = #KEYS - 1
local out, best, best_key = {ticket, 0}, nil, nil
for i = 1, n do
  local c = redis.call('ZCOUNT', KEYS[i + 1], ARGV[2], '+inf')
  out[i + 2] = c
  local key = c * n + ((i - 1 - ticket) % n)
  if best_key == nil or key < best_key then best, best_key = i, key end
end
redis.call('ZREMRANGEBYSCORE', KEYS[best + 1], '-inf', '(' .. ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[ticket % n + 2], '-inf', '(' .. ARGV[2])
redis.call('ZADD', KEYS[best + 1], ARGV[3], ARGV[1])
redis.call('PEXPIRE', KEYS[best + 1], ARGV[4])
out[2] = best - 1
return out
"""


# Rebuilds a sum hash from its fields: KEYS[1] the decode registry (every front is a decode
# replica), KEYS[2] the fields hash, KEYS[3] its sum hash; ARGV[1] now, ARGV[2] the heartbeat
# timeout. Drops the fields of fronts whose heartbeat is older (a dead front cannot take its
# counts back) and returns the sums as a flat [replica, sum, ...] list.
RECOUNT = """
local live = {}
local reg = redis.call('HGETALL', KEYS[1])
for i = 1, #reg, 2 do
  local ok, entry = pcall(cjson.decode, reg[i + 1])
  if ok and tonumber(ARGV[1]) - (tonumber(entry.ts) or 0) <= tonumber(ARGV[2]) then live[reg[i]] = true end
end
local sums, out = {}, {}
local fields = redis.call('HGETALL', KEYS[2])
for i = 1, #fields, 2 do
  local replica, front = string.match(fields[i], '^(.-) (.*)$')
  if replica and live[front] then
    sums[replica] = (sums[replica] or 0) + math.max(0, tonumber(fields[i + 1]) or 0)
  else
    redis.call('HDEL', KEYS[2], fields[i])
  end
end
redis.call('DEL', KEYS[3])
for replica, v in pairs(sums) do
  redis.call('HSET', KEYS[3], replica, tostring(v))
  out[#out + 1] = replica
  out[#out + 1] = tostring(v)
end
return out
"""


def inflight_field(replica: str, front: str) -> str:
    return f"{replica} {front}"


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
