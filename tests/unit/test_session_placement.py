"""Placing sessions that have no live pin (redis_state.PLACE, run by a front's routing decision)
on a real Redis server: bursts spread evenly, expired sessions neither count nor stay."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from deployments.front.metrics import IngressMetrics
from deployments.front.request_routing import RequestRouting
from routing.prefix import redis_state
from routing.prefix.redis_state import Registry
from tests.unit.test_redis_state import REDIS_READS, clients, run  # noqa: F401 - clients is a fixture


def test_fronts_placing_a_burst_of_new_sessions_spread_them_evenly(clients):
    """Two fronts place 8 new sessions at once (every read sees the same counts): the shared
    ticket makes them take turns, 4 and 4. Each replica's set counts its sessions; a re-pin
    moves the session from one set to the other, and later turns do not count twice."""
    sync, aio = clients
    cfg = REDIS_READS
    for name in ("d1", "d2"):
        Registry.beat(sync, "decode", name, {"capacity_blocks": 100, "url": f"http://127.0.0.1:1/{name}"})
    Registry.beat(sync, "prefill", "p1", {"capacity_blocks": 100, "url": "http://127.0.0.1:1/p1"})

    async def scenario(client):
        fronts = [RequestRouting(cfg, client, IngressMetrics(), f) for f in ("d1", "d2")]
        routes = await asyncio.gather(*(fronts[i % 2].route(list(range(i * 100, i * 100 + 10)), "t", f"s{i}")
                                        for i in range(8)))
        for f in fronts:
            await asyncio.gather(*f._pending)
        again = [await fronts[0].route(list(range(i * 100, i * 100 + 10)), "t", f"s{i}") for i in range(8)]
        await asyncio.gather(*fronts[0]._pending)
        return routes, again

    routes, again = run(aio, scenario)
    placed = Counter(r.decode_replica for r in routes)
    assert placed == {"d1": 4, "d2": 4}, placed
    assert [r.decode_replica for r in again] == [r.decode_replica for r in routes]
    assert all(r.reason == "pinned" for r in again)
    counts = {n: sync.zcard(redis_state.sessions_key("decode", n)) for n in ("d1", "d2")}
    assert counts == {"d1": 4, "d2": 4}
    assert sync.zcard(redis_state.sessions_key("prefill", "p1")) == 0  # decode-only: reservations taken back
    assert 0 < sync.pttl(redis_state.sessions_key("decode", "d1")) <= cfg.routing.pin_ttl_s * 1000

    moved = next(f"s{i}" for i, r in enumerate(routes) if r.decode_replica == "d1")
    sync.set(redis_state.pin_key("decode", moved), "d1")
    # 500 blocks of prefill queued on d1: staying costs that queue, moving a 10-token prompt nothing.
    sync.hset(redis_state.work_key("decode"), redis_state.inflight_field("d1", "d1"), 500)

    async def repin(client):
        routing = RequestRouting(cfg, client, IngressMetrics(), "d2")
        route = await routing.route(list(range(1000, 1010)), "t", moved)
        await asyncio.gather(*routing._pending)
        return route

    route = run(aio, repin)
    assert (route.decode_replica, route.repinned) == ("d2", True)
    assert {n: sync.zcard(redis_state.sessions_key("decode", n)) for n in ("d1", "d2")} == {"d1": 3, "d2": 5}


def test_placement_drops_sessions_whose_pins_expired(clients):
    """A replica's set still holds a session routed there longer ago than the pin TTL: the
    placement script drops it and does not count it, so the new session goes there."""
    sync, aio = clients
    cfg = REDIS_READS
    for name in ("d1", "d2"):
        Registry.beat(sync, "decode", name, {"capacity_blocks": 100, "url": f"http://127.0.0.1:1/{name}"})
    now = time.time()
    sync.zadd(redis_state.sessions_key("decode", "d1"), {"gone": now - 2 * cfg.routing.pin_ttl_s})
    sync.zadd(redis_state.sessions_key("decode", "d2"), {"live": now})

    async def place(client):
        routing = RequestRouting(cfg, client, IngressMetrics(), "d1")
        route = await routing.route(list(range(10)), "t", "new")
        await asyncio.gather(*routing._pending)
        return route

    assert run(aio, place).decode_replica == "d1"
    assert sync.zrange(redis_state.sessions_key("decode", "d1"), 0, -1) == [b"new"]


def test_every_replicas_set_is_swept_of_expired_sessions_within_n_placements(clients):
    """The placement script counts only live sessions everywhere but removes expired ones from the
    set the session joins and from one more in turn: after as many placements as replicas, no set
    holds an expired session, even one that no new session joined."""
    sync, aio = clients
    cfg = REDIS_READS
    names = ("d1", "d2", "d3")
    for name in names:
        Registry.beat(sync, "decode", name, {"capacity_blocks": 100, "url": f"http://127.0.0.1:1/{name}"})
    now = time.time()
    for name in names:
        sync.zadd(redis_state.sessions_key("decode", name), {f"gone-{name}": now - 2 * cfg.routing.pin_ttl_s})
    # d3 is full of live sessions, so no new session joins it: only the turn sweeps it.
    sync.zadd(redis_state.sessions_key("decode", "d3"), {f"live-{i}": now for i in range(10)})

    async def place(client):
        routing = RequestRouting(cfg, client, IngressMetrics(), "d1")
        chosen = [(await routing.route(list(range(10)), "t", f"new-{i}")).decode_replica for i in range(3)]
        await asyncio.gather(*routing._pending)
        return chosen

    assert "d3" not in run(aio, place)
    for name in names:
        members = {m.decode() for m in sync.zrange(redis_state.sessions_key("decode", name), 0, -1)}
        assert f"gone-{name}" not in members, name
