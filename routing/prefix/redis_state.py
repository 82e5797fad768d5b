"""Routing state shared through Redis: KV index, session pins, replica registry.

Keys (prefix `baton:`):
- `idx:h:{hash}`   set of replicas holding a block (Baton hash, tenant-salted)
- `idx:r:{replica}` set of blocks a replica holds (to clear it at once)
- `idx:c:{hash}`   set of child blocks seen after a block (its fan-out)
- `pin:{pool}:{session}` replica id, with the pin TTL
- `replicas:{pool}` hash replica id -> JSON {capacity_blocks, url, ts}
- `inflight:{pool}` hash `{replica} {front}` -> requests that front has in flight there
  (`inflight_work:{pool}` the same for queued prefill blocks); `...:sum` hashes
  replica -> the live fronts' total (deployments/front/shared_view.py). Written
  unlogged (`COUNTS`, `RECOUNT`), as the index is: counts of requests in flight
  are worth nothing after a restart, and with `appendfsync always` each count
  write waited for an fsync
- `idx:feed` a channel: the index's updates, as the indexer writes them (deployments/kv_index/index_feed.py)
- `idx:tr:*`, `idx:trs`, `idx:seq` the indexer's own state, so that its replacement resumes
  (deployments/kv_index/indexer_state.py)
- `sessions:{pool}:{replica}` sorted set session -> when it was last routed there
- `placements:{pool}` counter: one ticket per session placed (fronts take turns by it)

The KV indexer is the only writer of `idx:*`; a front writes pins with `pin_key`.
`RedisIndex` and the index's reads live in routing/prefix/redis_index.py.
"""

from __future__ import annotations

import hashlib
import json
import time

P = "baton:"
INDEXER_STATS_KEY = f"{P}indexer:stats"  # hash: the KV indexer's totals (deployments/kv_index/kv_indexer.py)
INDEX_EPOCH_KEY = f"{P}indexer:epoch"  # set while Redis holds an index; unlogged with it, so a restart drops it


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


# The first lines of every script whose writes stay out of the append-only file (and replicas):
# the index (routing/prefix/redis_index.py) and the fronts' counts. Redis before 7 needs effects
# replication switched on for that.
NO_AOF = """
if redis.replicate_commands then redis.replicate_commands() end
redis.set_repl(redis.REPL_NONE)
"""

# One front's count writes (deployments/front/request_routing.py `_publish`), unlogged: ARGV is
# a run of (counts key, field, value, replica, delta): the field set to the value, and where the
# delta is not '', the delta added to the replica's sum (`sum_key`).
COUNTS = NO_AOF + """
for i = 1, #ARGV, 5 do
  redis.call('HSET', ARGV[i], ARGV[i + 1], ARGV[i + 2])
  if ARGV[i + 4] ~= '' then redis.call('HINCRBYFLOAT', ARGV[i] .. ':sum', ARGV[i + 3], ARGV[i + 4]) end
end
"""
COUNTS_SHA = hashlib.sha1(COUNTS.encode()).hexdigest()  # sent by SHA; loaded where Redis lacks it


# Rebuilds a sum hash from its fields: KEYS[1] the decode registry (every front is a decode
# replica), KEYS[2] the fields hash, KEYS[3] its sum hash; ARGV[1] now, ARGV[2] the heartbeat
# timeout. Drops the fields of fronts whose heartbeat is older (a dead front cannot take its
# counts back) and returns the sums as a flat [replica, sum, ...] list.
RECOUNT = NO_AOF + """
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
