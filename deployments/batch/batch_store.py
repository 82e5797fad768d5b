"""Files and batches of the Batch API, in Redis, scoped to the tenant that made them.

Keys (`baton:` prefix):
- `file:<id>` hash: `meta` (the OpenAI file object plus its tenant) and `data`;
  `files:<tenant>` zset of the tenant's file ids by creation time;
- `batch:<id>` the batch object (JSON, plus its tenant); `batches:<tenant>`
  zset by creation time; `batches:active` the ids that still have lines to
  run or results to gather;
- `batch:<id>:lines` the input lines (list), `:todo` line numbers not yet
  claimed (list), `:running` claimed ones by lease expiry (zset), `:done`
  results by line number (hash), `:failed` how many of them are errors.

A front claims a line by moving it from `todo` to `running` with a lease
(one Lua script, so a front that dies between the two steps loses nothing),
renews the lease while the line runs, and records its result once (HSETNX:
a line run twice after a lapsed lease keeps its first result). Lines whose
lease lapsed (their front died) go back to `todo` (`reclaim`). Nothing here
decides when a line runs (deployments/batch/batch_runner.py does) or what a
request looks like on the wire (deployments/batch/batch_api.py).
"""

from __future__ import annotations

import json
import math
import secrets
import time

P = "baton:"
ACTIVE = f"{P}batches:active"
CHARS_PER_TOKEN = 4  # a line's prompt tokens before it is rendered: its messages' JSON length / 4
DEFAULT_OUTPUT_TOKENS = 256  # a line that sets no max_tokens


def line_work(line: str) -> tuple[int, int]:
    """An input line's (JSON text's) estimated (prompt tokens, output tokens): its messages' or
    prompt's length in characters / CHARS_PER_TOKEN, and max_tokens (or DEFAULT_OUTPUT_TOKENS) x n."""
    body = json.loads(line)["body"]
    text = json.dumps(body.get("messages", body.get("prompt", body.get("input", ""))))  # chat, text, responses
    out = body.get("max_completion_tokens") or body.get("max_tokens") or body.get("max_output_tokens")
    out = out if isinstance(out, int) and out > 0 else DEFAULT_OUTPUT_TOKENS
    n = body.get("n") if isinstance(body.get("n"), int) and body.get("n") > 0 else 1
    return len(text) // CHARS_PER_TOKEN + 1, out * n


_CLAIM = """
local n = redis.call('LPOP', KEYS[1])
if n then redis.call('ZADD', KEYS[2], ARGV[1], n) end
return n
"""
_RECLAIM = """
local ns = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
for _, n in ipairs(ns) do
  redis.call('ZREM', KEYS[2], n)
  redis.call('RPUSH', KEYS[1], n)
end
return #ns
"""
_COMPLETE = """
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 and ARGV[3] == '1' then
  redis.call('INCR', KEYS[3])
end
return 1
"""
_REQUEUE = """
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then redis.call('RPUSH', KEYS[1], ARGV[1]) end
return 1
"""


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


class BatchStore:
    """Reads and writes files, batches and their lines; every read is scoped by tenant."""

    def __init__(self, client) -> None:
        self.r = client
        self._claim = client.register_script(_CLAIM)
        self._reclaim = client.register_script(_RECLAIM)
        self._complete = client.register_script(_COMPLETE)
        self._requeue = client.register_script(_REQUEUE)

    # -- files ----------------------------------------------------------------

    async def put_file(self, tenant: str, filename: str, purpose: str, data: bytes) -> dict:
        """Stores a new file; returns its OpenAI file object."""
        meta = {"id": new_id("file-"), "object": "file", "bytes": len(data), "created_at": int(time.time()),
                "filename": filename, "purpose": purpose, "status": "processed"}
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(f"{P}file:{meta['id']}", mapping={"meta": json.dumps({**meta, "tenant": tenant}), "data": data})
        pipe.zadd(f"{P}files:{tenant}", {meta["id"]: time.time()})
        await pipe.execute()
        return meta

    async def file(self, tenant: str, file_id: str) -> dict | None:
        """The tenant's file object, or None (no such file, or another tenant's). Reads only."""
        raw = await self.r.hget(f"{P}file:{file_id}", "meta")
        if raw is None:
            return None
        meta = json.loads(raw)
        return meta if meta.pop("tenant") == tenant else None

    async def file_data(self, tenant: str, file_id: str) -> bytes | None:
        if await self.file(tenant, file_id) is None:
            return None
        return await self.r.hget(f"{P}file:{file_id}", "data")

    async def files(self, tenant: str, purpose: str | None = None) -> list[dict]:
        """The tenant's files, newest first."""
        out = []
        for fid in await self.r.zrevrange(f"{P}files:{tenant}", 0, -1):
            meta = await self.file(tenant, fid.decode() if isinstance(fid, bytes) else fid)
            if meta is not None and (purpose is None or meta["purpose"] == purpose):
                out.append(meta)
        return out

    async def delete_file(self, tenant: str, file_id: str) -> bool:
        """Deletes the tenant's file; False if it has none by that id."""
        if await self.file(tenant, file_id) is None:
            return False
        await self.r.delete(f"{P}file:{file_id}")
        await self.r.zrem(f"{P}files:{tenant}", file_id)
        return True

    # -- batches --------------------------------------------------------------

    async def create_batch(self, tenant: str, batch: dict, lines: list[str]) -> None:
        """Stores a new batch and its lines, all to run (or none, for a batch created failed)."""
        k = f"{P}batch:{batch['id']}"
        pipe = self.r.pipeline(transaction=True)
        pipe.set(k, json.dumps({**batch, "tenant": tenant}))
        pipe.zadd(f"{P}batches:{tenant}", {batch["id"]: time.time()})
        if lines:
            pipe.set(f"{k}:work", json.dumps([sum(w) for w in zip(*map(line_work, lines))]))
            pipe.rpush(f"{k}:lines", *lines)
            pipe.rpush(f"{k}:todo", *range(len(lines)))
            pipe.sadd(ACTIVE, batch["id"])
        await pipe.execute()

    async def batch(self, batch_id: str, tenant: str | None = None) -> dict | None:
        """The batch object with its tenant (`tenant` None: any tenant's) and live request counts."""
        raw = await self.r.get(f"{P}batch:{batch_id}")
        if raw is None:
            return None
        batch = json.loads(raw)
        if tenant is not None and batch["tenant"] != tenant:
            return None
        if batch["status"] in ("in_progress", "cancelling", "finalizing"):
            done, failed = await self.counts(batch_id)
            batch["request_counts"] = {"total": batch["request_counts"]["total"], "completed": done - failed,
                                       "failed": failed}
        return batch

    async def save_batch(self, batch: dict) -> None:
        """Writes the batch object (with its `tenant`) back; ends its activity when it is final."""
        await self.r.set(f"{P}batch:{batch['id']}", json.dumps(batch))
        if batch["status"] in ("completed", "failed", "expired", "cancelled"):
            await self.r.srem(ACTIVE, batch["id"])

    async def batches(self, tenant: str) -> list[str]:
        """The tenant's batch ids, newest first."""
        return [b.decode() if isinstance(b, bytes) else b for b in await self.r.zrevrange(f"{P}batches:{tenant}", 0, -1)]

    async def active(self) -> list[str]:
        return [b.decode() if isinstance(b, bytes) else b for b in await self.r.smembers(ACTIVE)]

    async def counts(self, batch_id: str) -> tuple[int, int]:
        """(lines with a result, of them errors)."""
        k = f"{P}batch:{batch_id}"
        pipe = self.r.pipeline(transaction=True)
        pipe.hlen(f"{k}:done")
        pipe.get(f"{k}:failed")
        done, failed = await pipe.execute()
        return int(done), int(failed or 0)

    async def unfinished(self, batch_id: str) -> tuple[int, int]:
        """(lines not yet claimed, lines running), read together (MULTI): a line given back
        (`requeue`, `reclaim`) or claimed moves between the two, and two separate reads could
        miss it in both and end the batch without it."""
        k = f"{P}batch:{batch_id}"
        pipe = self.r.pipeline(transaction=True)
        pipe.llen(f"{k}:todo")
        pipe.zcard(f"{k}:running")
        todo, running = await pipe.execute()
        return int(todo), int(running)

    async def backlog(self, now: float) -> tuple[float, float, float] | None:
        """The work in-progress batches still hold, for autoscaling: (prompt tokens, output tokens,
        seconds until the earliest is due), each batch's estimate (`line_work`) in proportion to its
        lines not yet finished; None when no batch has any. `now` is wall-clock time."""
        prompt = output = 0.0
        due = math.inf
        for batch_id in await self.active():
            k = f"{P}batch:{batch_id}"
            raw, work = await self.r.get(k), await self.r.get(f"{k}:work")
            if raw is None or work is None:
                continue
            batch = json.loads(raw)
            total, left = batch["request_counts"]["total"], sum(await self.unfinished(batch_id))
            if batch["status"] != "in_progress" or batch.get("expiring") or not total or not left:
                continue
            p, o = json.loads(work)
            prompt, output = prompt + p * left / total, output + o * left / total
            due = min(due, batch["expires_at"] - now)
        return None if math.isinf(due) else (prompt, output, max(0.0, due))

    # -- lines ----------------------------------------------------------------

    async def claim(self, batch_id: str, lease_s: float) -> tuple[int, str] | None:
        """A line to run (number, text), leased for `lease_s`; None when none is left to claim."""
        k = f"{P}batch:{batch_id}"
        n = await self._claim(keys=[f"{k}:todo", f"{k}:running"], args=[time.time() + lease_s])
        if n is None:
            return None
        n = int(n)
        line = await self.r.lindex(f"{k}:lines", n)
        return n, line.decode() if isinstance(line, bytes) else line

    async def renew(self, batch_id: str, n: int, lease_s: float) -> None:
        """Extends a running line's lease (only while it is still this batch's running line)."""
        await self.r.zadd(f"{P}batch:{batch_id}:running", {str(n): time.time() + lease_s}, xx=True)

    async def complete(self, batch_id: str, n: int, result: dict, failed: bool) -> None:
        """Records a line's result (the first one only) and ends its lease."""
        k = f"{P}batch:{batch_id}"
        await self._complete(keys=[f"{k}:done", f"{k}:running", f"{k}:failed"],
                             args=[n, json.dumps(result), "1" if failed else "0"])

    async def requeue(self, batch_id: str, n: int) -> None:
        """Gives a claimed line back to run later (it was refused for capacity)."""
        k = f"{P}batch:{batch_id}"
        await self._requeue(keys=[f"{k}:todo", f"{k}:running"], args=[n])

    async def reclaim(self, batch_id: str) -> int:
        """Puts lines whose lease lapsed (their front died) back to run; returns how many."""
        k = f"{P}batch:{batch_id}"
        return int(await self._reclaim(keys=[f"{k}:todo", f"{k}:running"], args=[time.time()]))

    async def drop_todo(self, batch_id: str) -> None:
        """Cancels the lines not yet claimed (cancel, expiry)."""
        await self.r.delete(f"{P}batch:{batch_id}:todo")

    async def results(self, batch_id: str) -> list[tuple[int, dict]]:
        """Every recorded result, by line number."""
        raw = await self.r.hgetall(f"{P}batch:{batch_id}:done")
        return sorted((int(n), json.loads(v)) for n, v in raw.items())

    async def lock(self, name: str, seconds: int) -> bool:
        """A short exclusive claim across fronts (finalising a batch); True if this caller has it."""
        return bool(await self.r.set(f"{P}lock:{name}", "1", nx=True, ex=seconds))
