"""State kept in Redis survives a Redis kill (redis.appendfsync), and writes made while it restarts
wait for it: a real redis-server, SIGKILLed and started again in the same directory, as `baton up`'s
supervision does."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import threading
import time

import pytest
import redis

from common.config import RedisConfig
from common.redis_retry import retried
from deployments.api.response_store import ResponseCapture, ResponseStore
from deployments.api.responses_api import ResponsesAPI
from deployments.batch.batch_store import BatchStore
from tests.unit.conftest import restart_redis, start_redis

pytestmark = pytest.mark.quiet  # fsync timings want an idle disk: run on a quiet machine (Makefile)

WRITES = 2000
KILLS = 6


def _kill(server) -> None:
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(10)


@pytest.mark.parametrize("appendfsync", ["everysec", "always"])
def test_every_acknowledged_write_survives_a_kill(tmp_path, appendfsync):
    """Every write Redis acknowledged is there after SIGKILL and a restart, on an idle disk: the
    append-only file is written before the reply. On a busy disk `everysec` may not be (below)."""
    server, url = start_redis(tmp_path, appendfsync)
    client = redis.Redis.from_url(url)
    for i in range(WRITES):
        client.hset("baton:batch:b1:done", str(i), f"result {i}")
    client.set("baton:resp:t:r1", "kept")
    _kill(server)
    restart_redis(server)
    try:
        client = redis.Redis.from_url(url)
        assert client.hlen("baton:batch:b1:done") == WRITES
        assert client.get("baton:resp:t:r1") == b"kept"
    finally:
        server.stop()


def _written(client: redis.Redis, timeout_s: float = 10) -> None:
    """Until Redis has handed every acknowledged write to the kernel, where a SIGKILL cannot lose it:
    with `everysec`, Redis holds writes back (up to 2 s) while a slow background fsync is running."""
    deadline = time.monotonic() + timeout_s
    while client.info("persistence")["aof_buffer_length"]:
        assert time.monotonic() < deadline, client.info("persistence")
        time.sleep(0.05)


def _loaded(url: str, timeout_s: float = 30) -> None:
    """Until a restarted Redis has loaded its append-only file (it answers LOADING meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            redis.Redis.from_url(url).ping()
            return
        except redis.BusyLoadingError:
            assert time.monotonic() < deadline, "Redis still loading its file"
            time.sleep(0.05)


def test_always_keeps_every_acknowledged_write_through_kills_while_the_disk_is_busy(tmp_path):
    """`always` (the default) never replies before its write is in the file. `everysec` holds
    the write back, for up to 2 s, while a background fsync still runs (a busy disk, or just
    after a rewrite), and replies anyway: with this test's disk load it lost 118 of 171k
    acknowledged writes in 1 of 16 kills (docs/deploy.md), which is why it is not the default."""
    server, url = start_redis(tmp_path, "always")
    busy = threading.Event()

    def load_the_disk() -> None:  # dirty pages on the same disk make each fsync slow
        block, i = b"\0" * 2**20, 0
        while not busy.is_set():
            with open(tmp_path / f"load{i % 2}", "wb") as f:
                for _ in range(32):
                    f.write(block)
            i += 1

    loader = threading.Thread(target=load_the_disk, daemon=True)
    loader.start()
    lost = []
    try:
        for kill in range(KILLS):
            client, acked = redis.Redis.from_url(url), 0
            until = time.monotonic() + 0.5 + 0.25 * kill
            while time.monotonic() < until:
                client.set(f"baton:resp:{kill}:{acked}", "x" * 2000)
                acked += 1
            _kill(server)
            restart_redis(server)
            _loaded(url)
            pipe = redis.Redis.from_url(url).pipeline(transaction=False)
            for i in range(acked):
                pipe.exists(f"baton:resp:{kill}:{i}")
            lost.append(acked - sum(pipe.execute()))
    finally:
        busy.set()
        loader.join(10)
        server.stop()
    assert lost == [0] * KILLS


def test_churn_keeps_the_append_only_file_compact_and_a_restart_loads_what_is_live(tmp_path):
    """The indexer's churn (blocks stored, then removed) writes far more than it keeps: Redis rewrites
    the file once it has doubled past AOF_REWRITE_MIN, so a restart loads what is live, not the
    history (with Redis's default 64mb, 32 MB of history took 6.2 s to load under load)."""
    server, url = start_redis(tmp_path, "everysec")
    try:
        client = redis.Redis.from_url(url)
        value = "x" * 1000
        rounds = iter(range(10_000))

        def churn(n: int) -> int:  # n MB of writes, ~1 MB live; returns the last round's number
            for round_ in itertools.islice(rounds, n):
                pipe = client.pipeline(transaction=False)
                for i in range(1000):
                    pipe.set(f"baton:idx:{i}", f"{round_}{value}")
                pipe.execute()
            return round_

        def size() -> int:  # Redis's cron starts a rewrite within 100 ms of the write that doubled the file
            return sum(f.stat().st_size for f in (tmp_path / "appendonlydir").iterdir())
        last = churn(40)
        # A rewrite slowed by a busy machine ends with what was written meanwhile as its base, and
        # the next waits until the file doubles that (CI once stopped at 14.7 MB): the churn goes on.
        deadline = time.monotonic() + 30
        while size() >= 12 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.2)
            last = churn(1)
        assert size() < 12 * 2**20, client.info("persistence")
        _written(client)
        _kill(server)
        restart_redis(server)
        client = redis.Redis.from_url(url)
        assert client.dbsize() == 1000 and client.get("baton:idx:7") == f"{last}{value}".encode()
    finally:
        server.stop()


def test_off_keeps_nothing(tmp_path):
    server, url = start_redis(tmp_path, "off")
    redis.Redis.from_url(url).set("k", "v")
    _kill(server)
    restart_redis(server)
    try:
        assert redis.Redis.from_url(url).get("k") is None
    finally:
        server.stop()


def test_a_response_finished_while_redis_restarts_is_kept(tmp_path):
    """The front's keep() waits out a restart: Redis is down when the answer ends and back a
    second later; the response is stored, and a chained turn then finds it."""
    server, url = start_redis(tmp_path, "everysec")
    _kill(server)
    client = RedisConfig(url=url).client(asynchronous=True, reconnect=True, socket_timeout=2)
    api = ResponsesAPI(ResponseStore(client, ttl_s=600, max_bytes=2**20), retry_s=20)
    response = {"id": "resp_1", "object": "response", "status": "completed", "output": []}

    async def run():
        keep = asyncio.ensure_future(api.keep("tenant-a", response, [{"role": "user", "content": "hi"}], "s1"))
        await asyncio.sleep(1.0)
        assert not keep.done()
        await asyncio.to_thread(restart_redis, server)
        try:
            assert await asyncio.wait_for(keep, 15) is True
            stored = await api.store.get("tenant-a", "resp_1")
        finally:
            await client.aclose()
            server.stop()
        return stored

    stored = asyncio.run(run())
    assert stored["response"]["id"] == "resp_1" and stored["session"] == "s1"
    assert api.given_up == 0


def test_a_turn_sent_while_redis_restarts_waits_for_it_and_continues_its_chain(tmp_path):
    """The response a Responses turn continues is read again until Redis is back (it restarts in
    0.5-1 s under `baton up`): the turn waits, and is not a 503 (bench chaos: one turn per kill)."""
    server, url = start_redis(tmp_path, "everysec")
    client = RedisConfig(url=url).client(asynchronous=True, reconnect=True, socket_timeout=2)
    api = ResponsesAPI(ResponseStore(client, ttl_s=600, max_bytes=2**20))
    first = {"id": "resp_1", "object": "response", "status": "completed", "output": []}
    body = {"model": "m", "input": "next", "previous_response_id": "resp_1"}

    async def run():
        assert await api.keep("tenant-a", first, [{"role": "user", "content": "hi"}], "s1")
        await asyncio.to_thread(_kill, server)
        turn = asyncio.ensure_future(api.chain(body, "tenant-a", None))
        await asyncio.sleep(0.5)
        assert not turn.done()
        await asyncio.to_thread(restart_redis, server)
        try:
            return await asyncio.wait_for(turn, 10)
        finally:
            await client.aclose()
            server.stop()

    assert asyncio.run(run()) == "s1"
    assert body["input"][0] == {"role": "user", "content": "hi"}  # the stored turn, then this one


def _completed_stream(response: dict) -> list[dict]:
    event = json.dumps({"type": "response.completed", "response": response}, separators=(",", ":"))
    return [{"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]},
            {"type": "http.response.body", "body": b'event: response.created\ndata: {}\n\n', "more_body": True},
            {"type": "http.response.body", "body": f"event: response.completed\ndata: {event}\n\n".encode(),
             "more_body": True},
            {"type": "http.response.body", "body": b"", "more_body": False}]


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_gets_the_answers_end_only_once_its_response_is_stored(tmp_path, stream):
    """The message that completes a Responses answer waits for its store: a client that has the id
    can chain on it at once (stored after the answer, a turn raced the write and got a 404 in a
    Redis kill at 16 replicas). With Redis away, it goes on after `hold_s`, the store still trying."""
    server, url = start_redis(tmp_path, "everysec")
    client = RedisConfig(url=url).client(asynchronous=True, reconnect=True, socket_timeout=2)
    api = ResponsesAPI(ResponseStore(client, ttl_s=600, max_bytes=2**20), retry_s=20, hold_s=0.5)
    response = {"id": "resp_1", "object": "response", "status": "completed", "output": []}
    if stream:
        messages = _completed_stream(response)
    else:
        messages = [{"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]},
                    {"type": "http.response.body", "body": json.dumps(response).encode(), "more_body": False}]

    async def run():
        seen, up = [], [True]  # per message the client got: whether the response was stored by then

        async def send(message):
            if up[0]:
                seen.append(await api.store.get("tenant-a", "resp_1") is not None)

        def capture():
            return ResponseCapture(send, lambda r: api.keep("tenant-a", r, [], "s1"), api.hold_s)
        try:
            kept = capture()
            for m in messages:
                await kept(m)
            stored_at = seen.index(True) if True in seen else None
            await asyncio.to_thread(_kill, server)  # Redis away: the end goes on after hold_s
            late, up[0] = capture(), False
            t0 = time.monotonic()
            for m in messages[:2 if stream else 1]:
                await late(m)
            held = asyncio.ensure_future(late(messages[2 if stream else 1]))
            await asyncio.wait_for(held, 5)
            waited = time.monotonic() - t0
            assert late.kept is not None and not late.kept.done()  # still trying, up to retry_s
            late.kept.cancel()
        finally:
            await client.aclose()
            server.stop()
        return stored_at, waited

    stored_at, waited = asyncio.run(run())
    # the message carrying the finished response (the JSON body, or response.completed) came stored
    assert stored_at == (2 if stream else 1)
    assert 0.4 < waited < 3


def test_a_batch_result_recorded_twice_is_kept_once(tmp_path):
    """What makes trying complete() again harmless: the first result of a line wins."""
    server, url = start_redis(tmp_path)
    store = BatchStore(RedisConfig(url=url).client(asynchronous=True))

    async def run():
        for result in ({"n": "first"}, {"n": "second"}):
            await store.complete("b1", 0, result, failed=False)
        return await store.r.hget("baton:batch:b1:done", "0")

    try:
        assert b"first" in asyncio.run(run())
    finally:
        server.stop()


def test_retried_gives_up_after_its_window():
    calls = []

    async def failing():
        calls.append(time.monotonic())
        raise redis.ConnectionError("down")

    t0 = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        asyncio.run(retried(failing, 0.6))
    assert 0.3 < time.monotonic() - t0 < 1.5 and len(calls) >= 4


def test_a_write_on_a_connection_closed_under_it_is_a_connection_error(redis_proc):
    """Under uvloop (Ray Serve's loop), redis-py's asyncio client raised a bare RuntimeError on
    a connection a restarting Redis had closed (a chaos run's Redis kill turned one routing read
    into a 500). Baton's clients raise a ConnectionError, which callers retry or fall back on."""
    import uvloop

    _, url = redis_proc

    async def run():
        client = RedisConfig(url=url).client(asynchronous=True)
        conn = await client.connection_pool.get_connection()
        conn._writer.transport.close()  # as the dead Redis's end did
        await asyncio.sleep(0.05)
        with pytest.raises(redis.ConnectionError):
            await conn.send_packed_command(b"*1\r\n$4\r\nPING\r\n", check_health=False)
        await client.connection_pool.release(conn)
        assert await client.ping()  # on a new connection
        await client.aclose()

    uvloop.run(run())
