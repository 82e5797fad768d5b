"""The KV index in Redis: `RedisIndex`, its one writer's updates, and a front's reads of a request's slice.

Keys (prefix `baton:`, as routing/prefix/redis_state.py lists them):
`idx:h:{hash}` the replicas holding a block, `idx:r:{replica}` the blocks a
replica holds, `idx:c:{hash}` the child blocks seen after a block.

The index and the indexer's own state (`idx:*`, the epoch) are written without
entering Redis's append-only file (`UNLOGGED`; Lua's `redis.set_repl`): they are
most of Redis's writes (at 64 engines, ~30k blocks stored and ~25k removed a
second), and with `redis.appendfsync: always` each of them waited for an fsync,
where a lost index costs only its rebuild from the indexer's own maps. A
restarted Redis therefore holds no index, or the stale one its last file
rewrite copied; the indexer tells the restart by Redis's run id and rewrites
the index (deployments/kv_index/kv_indexer.py `_check_redis`).

Within a batch (`begin` .. `flush`) every stored and removed block goes into
one script call (`_APPLY`), sent by SHA. At 64 engines, a call per event and
redis-py's check that Redis had the scripts before every flush (a second
round trip) took over a third of the indexer's thread; with one call per
flush it uses 0.52-0.65 of a core instead of 0.64-0.70
(docs/results/scale/indexer_one_script.json).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import redis

from routing.prefix.index_api import FANOUT_CAP, KVIndex
from routing.prefix.prefix_index import IndexSnapshot
from routing.prefix.redis_state import NO_AOF, P

# One write of any command, not logged (module docstring): KEYS[1] the key, ARGV[1] the command,
# ARGV[2..] its other arguments.
UNLOGGED = NO_AOF + """
return redis.call(ARGV[1], KEYS[1], unpack(ARGV, 2))
"""

# A batch's index updates, in order. ARGV is a run of ops:
#   'S', replica, parent block ('' for none), n, then n stored blocks in chain order: each gets the
#        replica as a holder and is its predecessor's child, and joins the replica's block set;
#   'R', replica, n, then n removed blocks: only blocks the replica held count, and a block that
#        nobody holds any more loses its fan-out.
# unpack() puts its values on Lua's stack (8,000 at most), hence the replica set's chunks of 1,000.
_APPLY = NO_AOF + """
local i = 1
while i <= #ARGV do
  local op, replica = ARGV[i], ARGV[i + 1]
  local rk = '""" + P + """idx:r:' .. replica
  if op == 'S' then
    local prev, first = ARGV[i + 2], i + 4
    local last = first + tonumber(ARGV[i + 3]) - 1
    for j = first, last do
      local h = ARGV[j]
      redis.call('SADD', '""" + P + """idx:h:' .. h, replica)
      if prev ~= '' then
        redis.call('SADD', '""" + P + """idx:c:' .. prev, h)
      end
      prev = h
    end
    for j = first, last, 1000 do
      redis.call('SADD', rk, unpack(ARGV, j, math.min(j + 999, last)))
    end
    i = last + 1
  else
    local first = i + 3
    local last = first + tonumber(ARGV[i + 2]) - 1
    for j = first, last do
      local h = ARGV[j]
      local was = redis.call('SREM', rk, h)
      local hk = '""" + P + """idx:h:' .. h
      redis.call('SREM', hk, replica)
      if was == 1 and redis.call('EXISTS', hk) == 0 then
        redis.call('DEL', '""" + P + """idx:c:' .. h)
      end
    end
    i = last + 1
  end
end
return 0
"""
MAX_ARGS = 20_000  # arguments per _APPLY call: Redis serves nobody else while a script runs


def _h(h: int) -> str:
    return f"{P}idx:h:{h}"


def _c(h: int) -> str:
    return f"{P}idx:c:{h}"


def _r(replica: str) -> str:
    return f"{P}idx:r:{replica}"


class RedisIndex(KVIndex):
    """The KVIndex contract over Redis (sync client).

    The KV indexer is its only writer. Outside a batch each update is one
    round trip; inside one (`begin` .. `flush`) updates wait in order and
    go in one. Fronts read a request's slice with `queue_snapshot` /
    `snapshot_from` inside their own pipeline, which is what `snapshot`
    does on its own.
    """

    def __init__(self, client) -> None:
        self.r = client
        self._batch = None  # an open pipeline while the writer batches (`begin`/`flush`)
        self._ops: list = []  # the batch's updates not yet on the pipeline (`_emit`)
        self._scripts = {name: client.register_script(src) for name, src in (("apply", _APPLY), ("unlogged", UNLOGGED))}
        self._loaded = False  # whether Redis has the scripts, as far as this writer knows

    def _call(self, pipe, name: str, keys: list, args: list):
        """Runs script `name` on the client, or queues it on `pipe` by its SHA alone: redis-py's own
        pipelined scripts ask Redis whether it has them on every execute, a round trip each."""
        script = self._scripts[name]
        if pipe is None:
            return script(keys=keys, args=args, client=self.r)  # loads it, where Redis lacks it
        if not self._loaded:
            for s in self._scripts.values():
                self.r.script_load(s.script)
            self._loaded = True
        return pipe.evalsha(script.sha, len(keys), *keys, *args)

    def restarted(self) -> None:
        """Redis restarted without its scripts: they are loaded again before the next pipelined call."""
        self._loaded = False

    def _execute(self, pipe) -> None:
        try:
            pipe.execute()
        except redis.exceptions.NoScriptError:
            self._loaded = False  # a restarted Redis: loaded again on the next call; the indexer rewrites
            raise

    def _emit(self, pipe) -> None:
        """Moves the waiting updates onto `pipe` as one script call."""
        if self._ops:
            ops, self._ops = self._ops, []
            self._call(pipe, "apply", [], ops)

    def _queue(self, op: list) -> None:
        self._ops += op
        if self._batch is None:
            pipe = self.r.pipeline(transaction=False)
            self._emit(pipe)
            self._execute(pipe)
        elif len(self._ops) >= MAX_ARGS:
            self._emit(self._batch)

    def unlogged(self, pipe, command: str, key: str, *args):
        """Runs (or queues, on a pipeline, after the batch's waiting updates) `command key *args` on
        `pipe`, or on the client where `pipe` is None, without logging it to the append-only file
        (module docstring); what the command changes, it changes in Redis's memory only."""
        if pipe is not None and pipe is self._batch:
            self._emit(pipe)
        return self._call(pipe, "unlogged", [key], [command, *args])

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
        self._emit(pipe)
        if then is not None:
            then(pipe)
        if publish:
            pipe.publish(*publish)
        if len(pipe):
            self._execute(pipe)

    def apply_stored(self, replica: str, block_hashes: Iterable[int], parent: int | None = None) -> None:
        """Each block gets the replica as a holder and is its predecessor's child (`parent`'s for
        the first), and joins the replica's block set."""
        hashes = list(block_hashes)
        if hashes:
            self._queue(["S", replica, "" if parent is None else parent, len(hashes), *hashes])

    def apply_removed(self, replica: str, block_hashes: Iterable[int]) -> None:
        """Only blocks the replica held count (removing one it never held changes nothing, even
        where nobody holds it: its recorded fan-out stays); a block nobody holds any more loses its
        fan-out too, as in PrefixIndex."""
        hashes = list(block_hashes)
        if hashes:
            self._queue(["R", replica, len(hashes), *hashes])

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


