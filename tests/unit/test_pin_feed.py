"""Session pins streamed to each front (deployments/front/pin_feed.py), on a real Redis: a front that
joins late loads the pins Redis holds and follows the other fronts' writes; a pinned turn's decision
then reads no pin from Redis; a lost subscription makes the front load again, reading Redis meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import msgspec
import pytest
import redis

from common.config import BatonConfig
from deployments.front.metrics import IngressMetrics
from deployments.front.pin_feed import CHANNEL, LocalPins, PinWriter
from deployments.front.request_routing import RequestRouting
from routing.prefix.redis_state import Registry, pin_key
from tests.unit.test_index_feed import _until


@pytest.fixture
def sync(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    for name in ("d1", "d2", "d3"):
        Registry.beat(client, "decode", name, {"capacity_blocks": 100, "url": f"http://127.0.0.1:1/{name}"})
    return client


def _front(client, name: str) -> RequestRouting:
    cfg = BatonConfig.model_validate({"colocated": True, "routing": {"pin_ttl_s": 30}})
    return RequestRouting(cfg, client, IngressMetrics(), name)


def _calls(sync, command: str) -> int:
    return int(sync.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_late_front_loads_the_pins_redis_holds_and_follows_the_others(redis_url, sync):
    sync.set(pin_key("decode", "old"), "d2", px=20_000)
    sync.set(pin_key("decode", "gone"), "d1", px=1)  # expired before the front loads

    async def scenario():
        client = redis.asyncio.Redis.from_url(redis_url)
        time.sleep(0.01)
        pins = LocalPins(client, 30, time.time)
        pins.start()
        await _until(lambda: pins.synced)
        now = time.time()
        assert pins.get("decode", "old", now) == "d2" and pins.get("decode", "gone", now) is None
        assert pins.get("decode", "old", now + 21) is None  # the loaded pin keeps its remaining TTL
        other = _front(client, "d3")  # another front pins a new session, and moves "old"
        for session in ("new", "old"):
            await other.route(list(range(64)), "t", session)
        await asyncio.gather(*other._pending)
        want = {s: sync.get(pin_key("decode", s)).decode() for s in ("new", "old")}
        await _until(lambda: {s: pins.get("decode", s, time.time()) for s in want} == want)
        await pins.stop()
        await client.aclose()
        return pins.resyncs

    assert asyncio.run(scenario()) == 0


def test_a_pinned_turn_reads_its_pin_from_memory_and_keeps_it(redis_url, sync):
    """No Redis read for the pin, and no write of it either while its last write is fresh."""
    async def scenario():
        client = redis.asyncio.Redis.from_url(redis_url)
        a, b = _front(client, "d1"), _front(client, "d2")
        first = await a.route(list(range(64)), "t", "s")
        await asyncio.gather(*a._pending)
        await b.route(list(range(64)), "t", "warm")  # b starts its feeds
        await _until(lambda: b.pins.synced and b.local.index is not None)
        await _until(lambda: b.pins.get("decode", "s", time.time()) == first.decode_replica)
        before = {c: _calls(sync, c) for c in ("mget", "set", "publish")}
        turns = [await b.route(list(range(64 + 16 * i)), "t", "s") for i in range(1, 4)]
        await asyncio.gather(*b._pending)
        # no pin read from Redis, and none written again: a's write is less than 5% of the TTL old
        assert {c: _calls(sync, c) for c in before} == before
        for front in (a, b):
            await asyncio.gather(front.pins.stop(), front.local.stop())
        await client.aclose()
        return first, turns

    first, turns = asyncio.run(scenario())
    assert {t.decode_replica for t in turns} == {first.decode_replica}
    assert [t.reason for t in turns] == ["pinned"] * 3


def test_a_kept_pin_is_written_again_once_a_twentieth_of_its_ttl_has_passed():
    pins = LocalPins(None, 30, time.time)
    pins.synced = True
    pins.wrote([("decode", "s", "d1", 100.0 + 30)])
    assert pins.fresh("decode", "s", 100.0 + 1.4) and not pins.fresh("decode", "s", 100.0 + 1.6)
    assert not pins.fresh("decode", "other", 100.0) and not pins.fresh("prefill", "s", 100.0)


def test_a_lost_subscription_reads_redis_until_the_pins_are_loaded_again(redis_url, sync):
    async def scenario():
        client = redis.asyncio.Redis.from_url(redis_url)
        front = _front(client, "d1")
        await front.route(list(range(64)), "t", "s")
        await _until(lambda: front.pins.synced and front.local.index is not None)
        sync.client_kill_filter(_type="pubsub")  # the front's subscriptions (pins and index) drop
        await _until(lambda: front.pins.resyncs == 1)
        sync.set(pin_key("decode", "s"), "d3", px=20_000)  # written while no front followed the feed
        turn = await front.route(list(range(64)), "t", "s")
        await _until(lambda: front.pins.synced)
        assert front.pins.get("decode", "s", time.time()) in ("d3", turn.decode_replica)
        await asyncio.gather(front.pins.stop(), front.local.stop())
        await client.aclose()
        return turn

    assert asyncio.run(scenario()).decode_replica == "d3"


def test_fronts_with_the_pins_in_memory_place_a_burst_evenly_without_a_round_trip(redis_url, sync):
    """New sessions placed from the fronts' copies: fewest sessions first, each front taking turns
    from its own ticket; no placement script and no session set written."""
    async def scenario():
        client = redis.asyncio.Redis.from_url(redis_url)
        fronts = [_front(client, f) for f in ("d1", "d2")]
        for f in fronts:
            await f.route(list(range(64)), "t", f"warm-{f.front}")
        await _until(lambda: all(f.pins.synced and f.local.index is not None for f in fronts))
        for f in fronts:
            await asyncio.gather(*f._pending)
        before = {c: _calls(sync, c) for c in ("evalsha", "zadd", "mget")}
        routes = await asyncio.gather(*(fronts[i % 2].route(list(range(i * 100, i * 100 + 64)), "t", f"s{i}")
                                        for i in range(12)))
        for f in fronts:
            await asyncio.gather(*f._pending)
        after = {c: _calls(sync, c) for c in before}
        for f in fronts:
            await asyncio.gather(f.pins.stop(), f.local.stop())
        await client.aclose()
        return routes, before, after

    routes, before, after = asyncio.run(scenario())
    assert after == before  # no script, no session set, no pin read
    # with the two warm sessions (one each, on any replicas) 14 sessions over 3 replicas: 4 to 6 each
    placed = Counter(r.decode_replica for r in routes)
    assert sum(placed.values()) == 12 and max(placed.values()) - min(placed.values()) <= 2, placed


def test_pins_redis_missed_are_written_once_it_is_back(tmp_path):
    """Redis away (stopped) while decisions pin sessions: their flush fails, the pins are kept
    (the latest per session; an expired one is dropped) and written with what remains of their
    TTL, and published, by the retry once the same server runs again, with no decision needed."""
    from tests.unit.conftest import restart_redis, start_redis

    server, url = start_redis(tmp_path)

    async def scenario():
        client = redis.asyncio.Redis.from_url(url)
        errors, tasks = [], set()
        writer = PinWriter(client, time.time, True, lambda: errors.append(1), tasks.add)
        writer.RETRY_S = 0.2
        server.stop()
        now = time.time()
        for pins in ([("decode", "s1", "d1", now + 30), ("decode", "gone", "d1", now + 0.3)],
                     [("decode", "s1", "d2", now + 30), ("prefill", "s2", "p1", now + 30)]):
            writer.send(lambda pipe, pins=pins: [pipe.set(pin_key(p, s), r) for p, s, r, _ in pins], pins)
            await asyncio.gather(*tasks, return_exceptions=True)
        assert errors and set(writer.unwritten) == {("decode", "s1"), ("decode", "gone"), ("prefill", "s2")}
        await asyncio.sleep(0.4)  # "gone" expires meanwhile
        restart_redis(server)  # blocking, as the subscription below: the retry (a timer) comes after both
        sync = redis.Redis.from_url(url)
        listener = sync.pubsub()
        listener.subscribe(CHANNEL)
        await _until(lambda: not writer.unwritten)
        listener.get_message(timeout=1)  # the subscription's confirmation
        published = msgspec.msgpack.decode(listener.get_message(timeout=1)["data"])
        assert published == [["decode", "s1", "d2", now + 30], ["prefill", "s2", "p1", now + 30]]
        got = {k: sync.get(pin_key(*k)) for k in (("decode", "s1"), ("prefill", "s2"), ("decode", "gone"))}
        assert got == {("decode", "s1"): b"d2", ("prefill", "s2"): b"p1", ("decode", "gone"): None}
        assert 25_000 < sync.pttl(pin_key("decode", "s1")) <= 30_000
        await client.aclose()
        return sync

    try:
        asyncio.run(scenario())
    finally:
        server.stop()


def test_a_kept_pin_never_overwrites_a_newer_pin_another_front_wrote(redis_url, sync):
    """A pin this front could not write is written again only where Redis holds an older pin for
    its session (or none), and published only then: another front that placed the session since
    keeps its placement, in Redis and in every front's copy."""
    async def scenario():
        client = redis.asyncio.Redis.from_url(redis_url)
        errors, tasks = [], set()
        writer = PinWriter(client, time.time, True, lambda: errors.append(1), tasks.add)
        writer.KEEP_CHUNK = 2  # two calls
        now = time.time()
        writer.unwritten = {("decode", "moved"): ("d1", now + 20), ("decode", "older"): ("d1", now + 20),
                            ("decode", "absent"): ("d1", now + 20)}
        sync.set(pin_key("decode", "moved"), "d2", px=30_000)  # another front's, after this one's
        sync.set(pin_key("decode", "older"), "d3", px=10_000)  # written before this front's kept pin
        listener = sync.pubsub()
        listener.subscribe(CHANNEL)
        listener.get_message(timeout=1)  # the subscription's confirmation
        writer.send(lambda pipe: None, [])
        await asyncio.gather(*tasks)
        assert not errors and not writer.unwritten
        got = {s: sync.get(pin_key("decode", s)) for s in ("moved", "older", "absent")}
        assert got == {"moved": b"d2", "older": b"d1", "absent": b"d1"}
        assert 28_000 < sync.pttl(pin_key("decode", "moved")) <= 30_000
        assert 15_000 < sync.pttl(pin_key("decode", "older")) <= 20_000
        published = [pin for _ in range(2) for pin in msgspec.msgpack.decode(listener.get_message(timeout=1)["data"])]
        assert sorted(published) == [["decode", "absent", "d1", now + 20], ["decode", "older", "d1", now + 20]]
        assert listener.get_message(timeout=0.2) is None
        await client.aclose()

    asyncio.run(scenario())
