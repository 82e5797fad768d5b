"""State kept in Redis survives a Redis kill (redis.appendfsync), and writes made while it restarts
wait for it: a real redis-server, SIGKILLed and started again in the same directory, as `baton up`'s
supervision does."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
import redis

from common.config import RedisConfig
from common.redis_retry import retried
from deployments.api.response_store import ResponseStore
from deployments.api.responses_api import ResponsesAPI
from deployments.batch.batch_store import BatchStore
from tests.unit.conftest import restart_redis, start_redis

WRITES = 2000


def _kill(server) -> None:
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(10)


@pytest.mark.parametrize("appendfsync", ["everysec", "always"])
def test_every_acknowledged_write_survives_a_kill(tmp_path, appendfsync):
    """Every write Redis acknowledged is there after SIGKILL and a restart: the append-only file is
    written before the reply, so only a machine crash can lose `everysec`'s last second."""
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
