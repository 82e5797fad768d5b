"""The fronts' shared counts on a real Redis server: each front's requests in flight and queued
prefill blocks per replica, their sums, the recount, and what a Redis outage or restart leaves."""

from __future__ import annotations

import asyncio
import time

import redis

from common.config import BatonConfig
from routing.prefix import redis_state
from routing.prefix.redis_state import Registry
from tests.unit.test_redis_state import clients, run  # noqa: F401 - clients is a fixture


def test_fronts_see_each_others_requests_in_flight(clients):
    """A front places by what every live front has in flight, not only by its own count and
    the engines' heartbeats (up to routing.heartbeat_s old)."""
    from common.config import BatonConfig
    from deployments.front.metrics import IngressMetrics
    from deployments.front.request_routing import RequestRouting

    sync, aio = clients
    cfg = BatonConfig.model_validate({"routing": {"policy": "least_loaded", "local_index": False}})
    for name in ("d1", "d2"):  # each decode replica is a front too
        Registry.beat(sync, "decode", name, {"capacity_blocks": 100, "url": f"http://127.0.0.1:1/{name}"})
    sync.hset(redis_state.inflight_key("decode"), redis_state.inflight_field("d2", "gone"), 9)

    async def scenario(client):
        a, b = (RequestRouting(cfg, client, IngressMetrics(), front) for front in ("d1", "d2"))
        routes = [await a.route(list(range(10)), "t", None) for _ in range(2)]
        routes = [r for r in routes if r.decode_replica == "d1"]
        for r in routes:
            a.started(r)
        await asyncio.gather(*a._pending)
        seen = await b.route(list(range(10)), "t", None)  # b's first turn alone would pick d1
        await asyncio.gather(*b._pending)
        for r in routes:
            a.finished(r)
        await asyncio.gather(*a._pending)
        return len(routes), seen, await client.hgetall(redis_state.inflight_key("decode"))

    on_d1, seen, left = run(aio, scenario)
    assert on_d1 >= 1
    assert seen.decode_replica == "d2"
    assert left == {b"d1 d1": b"0"}  # the dead front's field went at b's read; a's count is back to 0


def test_a_front_reuses_its_view_of_the_fronts_counts_and_refreshes_it_beside_requests(clients):
    """routing.shared_state_ms: within it a decision reads only the index slice and the pins; past
    it the decision still uses the view it has and a refresh starts beside it; the next one sees it."""
    from common.config import BatonConfig
    from deployments.front.metrics import IngressMetrics
    from deployments.front.request_routing import RequestRouting

    sync, aio = clients
    cfg = BatonConfig.model_validate({"routing": {"policy": "least_loaded", "shared_state_ms": 200,
                                                  "local_index": False}})
    for name in ("d1", "d2"):
        Registry.beat(sync, "decode", name, {"capacity_blocks": 100, "url": f"http://127.0.0.1:1/{name}"})

    async def scenario(client):
        front = RequestRouting(cfg, client, IngressMetrics(), "d1")
        first = await front.route(list(range(64)), "t", None)
        other = "d2" if first.decode_replica == "d1" else "d1"
        # another front fills `other` with requests (its field, and the sum, as _publish writes them):
        # not seen while the view is young
        key = redis_state.inflight_key("decode")
        sync.hset(key, redis_state.inflight_field(other, "d2"), 50)
        sync.hincrbyfloat(redis_state.sum_key(key), other, 50)
        cmds = int(sync.info("stats")["total_commands_processed"])
        young = await front.route(list(range(64)), "t", None)
        reads = int(sync.info("stats")["total_commands_processed"]) - cmds - 1  # less the INFO itself
        await asyncio.sleep(0.25)
        read_at = front.view._view[0]
        await front.route(list(range(64)), "t", None)  # decides on the old view, starts the refresh
        await asyncio.sleep(0.05)
        refreshed = front.view._view[0] > read_at
        fresh = [(await front.route(list(range(64)), "t", None)).decode_replica for _ in range(3)]
        return other, young, reads, refreshed, fresh

    other, young, reads, refreshed, fresh = run(aio, scenario)
    assert young.decode_replica == other and reads == 4  # the 2 blocks' holders and fan-outs only
    assert refreshed
    assert other not in fresh  # 50 in flight there now counts


def test_sums_follow_the_fronts_fields_and_a_recount_repairs_them(clients):
    """Each front adds its changes to the replicas' sums (what a routing read takes); RECOUNT
    rebuilds them from live fronts' fields, dropping a dead front's and undoing a lost increment."""
    from common.config import BatonConfig
    from deployments.front.metrics import IngressMetrics
    from deployments.front.request_routing import RequestRouting

    sync, aio = clients
    cfg = BatonConfig.model_validate({"routing": {"policy": "round_robin", "local_index": False}})
    for name in ("d1", "d2"):
        Registry.beat(sync, "decode", name, {"capacity_blocks": 100, "url": f"http://127.0.0.1:1/{name}"})
    key = redis_state.inflight_key("decode")

    async def scenario(client):
        a, b = (RequestRouting(cfg, client, IngressMetrics(), f) for f in ("d1", "d2"))
        routes = [(f, await f.route(list(range(64)), "t", None)) for f in (a, b, a, b, a)]
        for f, r in routes:
            f.started(r)
        f, r = routes[0]
        f.finished(r)
        await asyncio.gather(*a._pending, *b._pending)

    run(aio, scenario)
    fields = {k.decode(): int(v) for k, v in sync.hgetall(key).items()}
    sums = {k.decode(): float(v) for k, v in sync.hgetall(redis_state.sum_key(key)).items()}
    want = {r: sum(v for f, v in fields.items() if f.startswith(r + " ")) for r in ("d1", "d2")}
    assert sums == want and sum(want.values()) == 4
    sync.hincrbyfloat(redis_state.sum_key(key), "d1", 7)  # an increment that should not be there
    sync.hset(key, redis_state.inflight_field("d2", "gone"), 9)  # a front with no heartbeat
    flat = sync.eval(redis_state.RECOUNT, 3, redis_state.registry_key("decode"), key, redis_state.sum_key(key),
                     time.time(), 6)
    assert {k.decode(): float(v) for k, v in zip(flat[::2], flat[1::2])} == want
    assert redis_state.inflight_field("d2", "gone").encode() not in sync.hgetall(key)


def _beat(sync) -> None:
    for name in ("d1", "d2"):
        Registry.beat(sync, "decode", name, {"capacity_blocks": 100, "url": f"http://127.0.0.1:1/{name}"})


def _fields(sync) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in sync.hgetall(redis_state.inflight_key("decode")).items()}


def _kill(server) -> None:
    server.proc.kill()
    server.proc.wait()


async def _settle(front) -> None:
    """Waits for the front's count writes, those they queue included; failures are left in them."""
    while front._pending:
        await asyncio.gather(*front._pending, return_exceptions=True)


def _front_of(client, sync):
    """A round-robin front `d1` on `client`, with `d1` and `d2` registered (_beat)."""
    from deployments.front.metrics import IngressMetrics
    from deployments.front.request_routing import RequestRouting

    _beat(sync)
    cfg = BatonConfig.model_validate({"routing": {"policy": "round_robin", "local_index": False}})
    return RequestRouting(cfg, client, IngressMetrics(), "d1")


def test_counts_a_front_could_not_write_are_written_once_redis_is_back(tmp_path):
    """Counts are written unlogged (a restarted Redis has none): requests that finish while
    Redis is away fail their writes, and the front's next write, though for one replica, writes
    every count again; a restart the front never saw fail (no write meanwhile) is found by the
    count script missing, and every count is written again right after. Each asks for a recount."""
    from tests.unit.conftest import restart_redis, start_redis

    server, url = start_redis(tmp_path, "always")
    sync = redis.Redis.from_url(url)

    async def scenario(client):
        front = _front_of(client, sync)
        routes = [await front.route(list(range(64)), "t", None) for _ in range(4)]
        for r in routes:
            front.started(r)
        await _settle(front)
        seen = [_fields(sync)]
        _kill(server)
        for r in routes:  # their writes fail
            front.finished(r)
        failed = await asyncio.gather(*front._pending, return_exceptions=True)
        restart_redis(server)
        _beat(sync)
        front.started(routes[0])  # one replica's count changes
        await _settle(front)
        seen.append(_fields(sync))
        front.finished(routes[0])  # two more writes: the second of them an ordinary one
        front.started(routes[0])
        await _settle(front)
        assert not front._resend
        front.view._recounted = 1.0
        _kill(server)  # nothing written while it is away
        restart_redis(server)
        await client.connection_pool.disconnect()  # as a read meanwhile would find: a new connection
        front.started(routes[1])
        await _settle(front)
        seen.append(_fields(sync))
        return seen, failed, front.view._recounted

    try:
        seen, failed, recounted = run(url, scenario)
        assert seen[0] == {"d1 d1": 2, "d2 d1": 2}
        assert failed and all(isinstance(e, Exception) for e in failed)
        assert sorted(seen[1].values()) == [0, 1] and set(seen[1]) == {"d1 d1", "d2 d1"}
        assert seen[2] == {"d1 d1": 1, "d2 d1": 1}, seen  # d1 unchanged since the restart, written again
        assert recounted == 0.0  # the next view is a recount
    finally:
        server.stop()


def test_count_changes_made_while_a_write_waits_go_in_one_call(clients):
    """A busy front makes one count write per Redis round trip: the changes made meanwhile wait
    for it and go in one script call, applied in their order (the last count set, deltas summed)."""
    sync, aio = clients
    key = redis_state.inflight_key("decode")

    def calls() -> int:
        stats = sync.info("commandstats")
        return sum(v.get("calls", 0) for k, v in stats.items() if "evalsha" in k)

    async def scenario(client):
        front = _front_of(client, sync)
        routes = [await front.route(list(range(64)), "t", None) for _ in range(20)]
        await _settle(front)
        before = calls()
        for r in routes:  # 20 changes in one go, then 6 more
            front.started(r)
        for r in routes[:6]:
            front.finished(r)
        await _settle(front)
        return calls() - before

    made = run(aio, scenario)
    assert 1 <= made <= 2, made  # one, or two where the first write began before the rest were queued
    sums = {k.decode(): float(v) for k, v in sync.hgetall(redis_state.sum_key(key)).items()}
    assert _fields(sync) == {"d1 d1": 7, "d2 d1": 7} and sums == {"d1": 7.0, "d2": 7.0}


def test_while_redis_is_away_a_failed_count_write_holds_the_next_back(tmp_path):
    """With Redis down, each count change would try (and fail) a write of every count; after a
    failed write the next waits COUNT_RETRY_S, taking every change made meanwhile, so a front
    busy through an outage makes a few failed writes a second, not one per change. The counts
    are right once Redis is back."""
    from tests.unit.conftest import restart_redis, start_redis

    server, url = start_redis(tmp_path, "always")
    sync = redis.Redis.from_url(url)

    async def scenario(client):
        front = _front_of(client, sync)
        routes = [await front.route(list(range(64)), "t", None) for _ in range(2)]
        await _settle(front)
        _kill(server)
        t0, changes = time.monotonic(), 0
        while time.monotonic() - t0 < 1.25:  # a busy front: two changes every 5 ms, 2.5 pauses long
            route = routes[changes // 2 % 2]
            front.started(route)
            front.finished(route)
            changes += 2
            await asyncio.sleep(0.005)
        failed = front.metrics.write_errors._value.get()
        front.started(routes[0])  # one request still in flight when Redis is back
        restart_redis(server)
        _beat(sync)
        await _settle(front)
        return changes, failed

    try:
        changes, failed = run(url, scenario)
        assert changes > 100 and 1 <= failed <= 4, (changes, failed)  # 236 of 472 with no pause
        live = {k: v for k, v in _fields(sync).items() if v}
        assert list(live.values()) == [1] and live.keys() <= {"d1 d1", "d2 d1"}, _fields(sync)
    finally:
        server.stop()
