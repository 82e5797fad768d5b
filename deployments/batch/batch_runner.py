"""Runs batch lines in the capacity interactive traffic leaves free, on every front.

Each front's runner looks at the active batches (deployments/batch/batch_store.py)
every `batch.poll_s` (at once again after it started a line) and, while
- fewer than `batch.max_in_flight` of its lines run,
- nothing waits in its admission queue, and
- more than `batch.reserve_permits` of its engine permits are free,
claims one line and runs it through this front's own request path as the
batch's tenant, in the lowest admission tier (`batch.tier`): admission,
routing, billing and the tenant's cache salt are those of any request, and
an interactive request that arrives meanwhile goes first in the queue. A
line the admission refuses (429) or that finds its model waking (503) goes
back to run later; any other answer is its result, kept in Redis. While a
line runs its lease is renewed; if its front dies, the lease lapses and any
front's runner puts the line back (`reclaim`): unfinished lines are retried,
finished ones kept. When no line is left, one front (a lock) writes the
output and error files and ends the batch `completed` (or `cancelled`, or
`expired` past its completion window).
"""

from __future__ import annotations

import asyncio
import json
import time

import redis

from common.config import BatonConfig
from common.constants import TIER_HEADER
from common.redis_retry import retried
from deployments.batch.batch_store import BatchStore, new_id

RETRY_CODES = (429, 503)  # not now: the line runs again later


class BatchRunner:
    """One front's runner; `app` is the front (ASGI), `gate` its admission."""

    def __init__(self, cfg: BatonConfig, store: BatchStore, gate, app) -> None:
        self.cfg, self.store, self.gate, self.app = cfg, store, gate, app
        self.running: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None
        self.backlog: tuple[float, float, float] | None = None  # BatchStore.backlog, for autoscaling
        self._backlog_at = 0.0

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        while True:
            await self._measure_backlog()
            try:
                started = await self.tick()
            except (redis.RedisError, OSError):
                started = False
            await asyncio.sleep(0.05 if started else self.cfg.batch.poll_s)

    async def _measure_backlog(self) -> None:
        """Refreshes `backlog` (at most once a second); None while it cannot be read."""
        if time.monotonic() < self._backlog_at:
            return
        self._backlog_at = time.monotonic() + 1.0
        try:
            self.backlog = await self.store.backlog(time.time())
        except Exception:  # noqa: BLE001 - a figure for autoscaling must never stop the runner
            self.backlog = None

    def _room(self) -> bool:
        snap = self.gate.snapshot()
        return (len(self.running) < self.cfg.batch.max_in_flight and snap.queue_len == 0
                and snap.capacity - snap.permits_in_use > self.cfg.batch.reserve_permits)

    async def tick(self) -> bool:
        """Reclaims lapsed lines, ends finished batches and starts at most one line; True if it did."""
        for batch_id in await self.store.active():
            batch = await self.store.batch(batch_id)
            if batch is None:
                continue
            if batch["status"] == "in_progress" and time.time() > batch["expires_at"]:
                batch["expiring"] = True
                await self.store.save_batch(batch)
                await self.store.drop_todo(batch_id)
            await self.store.reclaim(batch_id)
            todo, running = await self.store.unfinished(batch_id)
            if todo == 0 and running == 0:
                await self.finalize(batch_id)
                continue
            if batch["status"] != "in_progress" or batch.get("expiring") or not self._room():
                continue
            claim = await self.store.claim(batch_id, self.cfg.batch.lease_s)
            if claim is not None:
                task = asyncio.ensure_future(self._run_line(batch, *claim))
                self.running.add(task)
                task.add_done_callback(self.running.discard)
                return True
        return False

    async def _run_line(self, batch: dict, n: int, text: str) -> None:
        req = json.loads(text)
        renew = asyncio.ensure_future(self._renew(batch["id"], n))
        try:
            status, body, request_id = await asyncio.wait_for(
                self._call(batch["tenant"], req["url"], req["body"]), self.cfg.serve.request_timeout_s)
        except asyncio.TimeoutError:
            status, body, request_id = 504, {"error": {"message": "timed out", "type": "server_error"}}, None
        except Exception:  # noqa: BLE001 - the lease lapses and the line runs again
            return
        finally:
            renew.cancel()
        if status in RETRY_CODES:
            await self.store.requeue(batch["id"], n)
            return
        result = {"id": new_id("batch_req_"), "custom_id": req["custom_id"],
                  "response": {"status_code": status, "request_id": request_id, "body": body}, "error": None}
        # kept first-only (HSETNX), so trying again while Redis restarts is harmless; given up, the
        # lease lapses and the line runs again
        await retried(lambda: self.store.complete(batch["id"], n, result, failed=status != 200),
                      self.cfg.batch.lease_s / 2)

    async def _renew(self, batch_id: str, n: int) -> None:
        """Renews line `n`'s lease every third of it until cancelled; a renewal Redis missed (it was
        restarting) is made at the next one."""
        while True:
            await asyncio.sleep(self.cfg.batch.lease_s / 3)
            try:
                await self.store.renew(batch_id, n, self.cfg.batch.lease_s)
            except redis.RedisError:
                continue

    async def _call(self, tenant: str, path: str, body: dict) -> tuple[int, dict, str | None]:
        """Runs one request through the front as `tenant`, in the batch tier; (status, JSON body, request id)."""
        raw = json.dumps({**body, "stream": False}).encode()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
                 "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0), "baton.tenant": tenant,
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
                             (TIER_HEADER.encode(), self.cfg.batch_tier().encode())]}
        sent, hold = [False], asyncio.Event()

        async def receive():
            if not sent[0]:
                sent[0] = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await hold.wait()  # no disconnect: the line's "client" waits for the whole answer
            return {"type": "http.disconnect"}

        status, chunks, request_id = [500], [], [None]

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                request_id[0] = dict(message.get("headers") or []).get(b"x-request-id", b"").decode() or None
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        try:
            await self.app(scope, receive, send)
        finally:
            hold.set()
        try:
            answer = json.loads(b"".join(chunks) or b"{}")
        except ValueError:
            answer = {"error": {"message": b"".join(chunks).decode(errors="replace")[:500], "type": "server_error"}}
        return status[0], answer, request_id[0]

    async def finalize(self, batch_id: str) -> None:
        """Writes the output and error files of a batch with no line left and ends it (one front does)."""
        if not await self.store.lock(f"finalize:{batch_id}", 60):
            return
        batch = await self.store.batch(batch_id)
        if batch is None or batch["status"] not in ("in_progress", "cancelling"):
            return
        results = [r for _, r in await self.store.results(batch_id)]
        ok = [r for r in results if r["response"]["status_code"] == 200]
        bad = [r for r in results if r["response"]["status_code"] != 200]
        now = int(time.time())
        for rows, field, suffix in ((ok, "output_file_id", "output"), (bad, "error_file_id", "error")):
            if rows:
                data = "".join(json.dumps(r) + "\n" for r in rows).encode()
                meta = await self.store.put_file(batch["tenant"], f"{batch_id}_{suffix}.jsonl", "batch_output", data)
                batch[field] = meta["id"]
        final = "cancelled" if batch["status"] == "cancelling" else "expired" if batch.get("expiring") else "completed"
        batch.update(status=final, finalizing_at=now, **{f"{final}_at": now})
        batch["request_counts"] = {"total": batch["request_counts"]["total"], "completed": len(ok), "failed": len(bad)}
        await self.store.save_batch(batch)
