"""The Batch API's store and runner (deployments/batch/batch_store.py, batch_runner.py) on a real Redis.

The runner's `app` here is a small ASGI app standing in for the front (the
e2e test runs the real one): it answers each line by its body, so the tests
can make a line be refused for capacity, fail, or never finish.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import redis.asyncio

from common.config import load_config
from deployments.admission import Admission, AsyncAdmission
from deployments.batch.batch_api import parse_lines
from deployments.batch.batch_runner import BatchRunner
from deployments.batch.batch_store import BatchStore

URL = "/v1/chat/completions"


def _line(cid: str, **body) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": URL, "body": {"model": "m", **body}})


def test_input_lines_are_checked_one_by_one():
    good = [_line("a"), _line("b")]
    lines, errors = parse_lines("\n".join(good).encode(), URL, 10)
    assert len(lines) == 2 and errors == []
    bad = [_line("a"), "not json", _line("a"), json.dumps({"custom_id": "c", "method": "GET", "url": URL, "body": {}}),
           json.dumps({"custom_id": "d", "method": "POST", "url": "/v1/completions", "body": {}}), "[1]"]
    lines, errors = parse_lines("\n".join(bad).encode(), URL, 10)
    assert len(lines) == 1
    assert [e["line"] for e in errors] == [2, 3, 4, 5, 6]
    assert "repeats custom_id 'a'" in errors[1]["message"]
    assert parse_lines(b"\n\n", URL, 10)[1][0]["code"] == "empty_file"
    assert parse_lines("\n".join(good).encode(), URL, 1)[1][0]["code"] == "too_many_requests"


class _Front:
    """Answers a line by its body's `answer`: a status, or "429-once" (refused the first time)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes]] = []

    async def __call__(self, scope, receive, send):
        body = json.loads((await receive())["body"])
        message = body["messages"][0]
        first = all(m != message for _, m, _ in self.seen)
        self.seen.append((scope["baton.tenant"], message, dict(scope["headers"])[b"x-baton-tier"]))
        answer = body.get("answer", 200)
        if answer == "429-once":
            answer = 429 if first else 200
        out = json.dumps({"echo": message} if answer == 200 else {"error": {"message": "no"}}).encode()
        await send({"type": "http.response.start", "status": answer, "headers": [(b"x-request-id", b"r1")]})
        await send({"type": "http.response.body", "body": out})


def _runner(store: BatchStore, app, **batch) -> BatchRunner:
    cfg = load_config(None, environ={})
    cfg.batch = cfg.batch.model_copy(update={"poll_s": 0.01, "reserve_permits": 0, **batch})
    gate = AsyncAdmission(Admission(cfg.admission, replicas=1))
    gate.set_capacity(4)
    return BatchRunner(cfg, store, gate, app)


async def _until_final(store: BatchStore, runner: BatchRunner, batch_id: str, tenant: str) -> dict:
    for _ in range(500):
        await runner.tick()
        await asyncio.sleep(0.01)
        batch = await store.batch(batch_id, tenant)
        if batch["status"] in ("completed", "cancelled", "expired"):
            return batch
    raise AssertionError(f"batch not final: {batch}")


def _batch(batch_id: str, total: int, **extra) -> dict:
    return {"id": batch_id, "object": "batch", "status": "in_progress", "expires_at": 2**40,
            "request_counts": {"total": total, "completed": 0, "failed": 0}, **extra}


def test_lines_run_as_their_tenant_in_the_batch_tier_and_end_in_output_and_error_files(redis_url):
    async def main():
        store, app = BatchStore(redis.asyncio.Redis.from_url(redis_url)), _Front()
        lines = [_line("ok", messages=["hello"]), _line("bad", messages=["x"], answer=400),
                 _line("later", messages=["refused once"], answer="429-once")]
        await store.create_batch("tenant-a", _batch("batch_1", 3), lines)
        runner = _runner(store, app)
        batch = await _until_final(store, runner, "batch_1", "tenant-a")
        assert await store.batch("batch_1", "tenant-b") is None  # another tenant sees nothing
        assert batch["status"] == "completed" and batch["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
        assert {(t, tier) for t, _, tier in app.seen} == {("tenant-a", b"batch")}
        assert [m for _, m, _ in app.seen].count("refused once") == 2  # refused for capacity, then run again
        out = [json.loads(x) for x in (await store.file_data("tenant-a", batch["output_file_id"])).splitlines()]
        err = [json.loads(x) for x in (await store.file_data("tenant-a", batch["error_file_id"])).splitlines()]
        assert {r["custom_id"] for r in out} == {"ok", "later"} and [r["custom_id"] for r in err] == ["bad"]
        assert out[0]["response"]["status_code"] == 200 and out[0]["response"]["request_id"] == "r1"
        assert await store.file("tenant-b", batch["output_file_id"]) is None
        await store.r.aclose()
    asyncio.run(main())


def test_a_line_whose_front_died_runs_again_and_finished_ones_are_kept(redis_url):
    async def main():
        store = BatchStore(redis.asyncio.Redis.from_url(redis_url))
        await store.create_batch("t", _batch("batch_2", 2), [_line("first", messages=["1"]),
                                                              _line("second", messages=["2"])])
        # A front claims the first line with a short lease and dies (never completes it).
        assert (await store.claim("batch_2", lease_s=0.2))[0] == 0
        app = _Front()
        batch = await _until_final(store, _runner(store, app, lease_s=0.2), "batch_2", "t")
        assert batch["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
        assert sorted(m for _, m, _ in app.seen) == ["1", "2"]
        # A result is recorded once: a late second completion of a line changes nothing.
        await store.complete("batch_2", 0, {"custom_id": "dup"}, failed=True)
        assert (await store.results("batch_2"))[0][1]["custom_id"] == "first"
        await store.r.aclose()
    asyncio.run(main())


def test_cancel_stops_unstarted_lines_and_expiry_ends_a_batch(redis_url):
    async def main():
        store = BatchStore(redis.asyncio.Redis.from_url(redis_url))
        await store.create_batch("t", _batch("batch_3", 3), [_line(f"c{i}", messages=[str(i)]) for i in range(3)])
        batch = await store.batch("batch_3", "t")
        batch.update(status="cancelling")
        await store.save_batch(batch)
        await store.drop_todo("batch_3")
        done = await _until_final(store, _runner(store, _Front()), "batch_3", "t")
        assert done["status"] == "cancelled" and done["request_counts"]["completed"] == 0
        await store.create_batch("t", _batch("batch_4", 1, expires_at=0), [_line("e", messages=["e"])])
        done = await _until_final(store, _runner(store, _Front()), "batch_4", "t")
        assert done["status"] == "expired" and done["expired_at"] is not None
        assert "batch_4" not in await store.active()
        await store.r.aclose()
    asyncio.run(main())


def test_lines_wait_while_interactive_requests_queue_or_the_reserve_is_taken(redis_url):
    async def main():
        store = BatchStore(redis.asyncio.Redis.from_url(redis_url))
        await store.create_batch("t", _batch("batch_5", 1), [_line("w", messages=["w"])])
        runner = _runner(store, _Front(), reserve_permits=2)
        held = [await runner.gate.acquire("someone") for _ in range(2)]  # 2 of 4 permits: 2 free, none spare
        assert await runner.tick() is False
        held.pop().release()
        assert await runner.tick() is True
        await store.r.aclose()
    asyncio.run(main())


def test_backlog_is_the_unfinished_share_of_each_batchs_estimated_work(redis_url):
    from deployments.batch.batch_store import CHARS_PER_TOKEN, DEFAULT_OUTPUT_TOKENS, line_work

    assert line_work(_line("a", messages=["x" * 40], max_tokens=10, n=2)) == (len('["' + "x" * 40 + '"]') // CHARS_PER_TOKEN
                                                                             + 1, 20)
    assert line_work(_line("b", prompt="hi"))[1] == DEFAULT_OUTPUT_TOKENS

    async def main():
        store = BatchStore(redis.asyncio.Redis.from_url(redis_url, db=7))  # no other test's batches
        await store.r.flushdb()
        assert await store.backlog(1000.0) is None
        lines = [_line(f"w{i}", messages=["y" * 400], max_tokens=50) for i in range(4)]
        await store.create_batch("t", _batch("batch_5", 4, expires_at=1600), lines)
        prompt, output, due = await store.backlog(1000.0)
        assert prompt == 4 * line_work(lines[0])[0] and output == 200 and due == 600
        await store.claim("batch_5", lease_s=60)  # running still counts; finished does not
        await store.complete("batch_5", 0, {"custom_id": "w0"}, failed=False)
        assert (await store.backlog(1000.0))[1] == 150
        batch = await store.batch("batch_5", "t")
        await store.save_batch(dict(batch, status="cancelling"))
        assert await store.backlog(1000.0) is None  # only in-progress batches wait to be run
        runner = _runner(store, _Front())
        await store.create_batch("t", _batch("batch_6", 1, expires_at=2**40), [lines[0]])
        task = asyncio.ensure_future(runner._loop())
        await asyncio.sleep(0.2)
        task.cancel()
        assert runner.backlog is not None and runner.backlog[1] == 50  # the replica reports this
        await store.r.aclose()
    asyncio.run(main())


def test_a_line_going_back_to_todo_is_never_seen_as_finished(redis_url):
    """`unfinished` reads todo and running as one snapshot: a line refused for capacity moves
    running -> todo between two separate reads, and the batch would end without it (CI, stop 78)."""
    async def main():
        store = BatchStore(redis.asyncio.Redis.from_url(redis_url))
        await store.create_batch("t", _batch("batch_race", 1), [_line("only", messages=["1"])])
        stop, seen = asyncio.Event(), []

        async def bounce():  # claim and give back, as a runner whose line gets 429s would
            while not stop.is_set():
                if await store.claim("batch_race", 60) is not None:
                    await store.requeue("batch_race", 0)

        bouncer = asyncio.ensure_future(bounce())
        for _ in range(3000):
            seen.append(sum(await store.unfinished("batch_race")))
        stop.set()
        await bouncer
        await store.r.aclose()
        assert min(seen) == 1
    asyncio.run(main())
