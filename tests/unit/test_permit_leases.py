"""Permits shared by fronts through leases on a real Redis server."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time

import pytest
import redis.asyncio

from common.config import AdmissionConfig
from deployments.admission import Admission, AsyncAdmission, Shed
from deployments.admission.permit_leases import PermitLeases, keys

CAP = 3  # permits per front: a pool of 6 for two fronts


def front(client, name: str, **kw) -> tuple[AsyncAdmission, PermitLeases]:
    cfg = AdmissionConfig(capacity_per_replica=CAP, max_queue_per_tenant=512, max_queue_total=1024,
                          default_deadline_s=30)
    gate = AsyncAdmission(Admission(cfg, replicas=1))
    return gate, PermitLeases(client, name, cfg, gate, **kw)


def run(url: str, fn, **client_kw):
    """Runs ``fn(client)`` on an emptied Redis with a client of its own, bounded in time."""
    async def main():
        client = redis.asyncio.Redis.from_url(url, **client_kw)
        await client.flushdb()
        try:
            return await fn(client)
        finally:
            await client.aclose()
    return asyncio.run(asyncio.wait_for(main(), 60))


async def _hammer(gate: AsyncAdmission, tenant: str, n: int, rng: random.Random, done: list) -> None:
    async def one():
        await asyncio.sleep(rng.uniform(0, 1.0))
        try:
            async with gate.slot(tenant):
                await asyncio.sleep(rng.uniform(0.005, 0.04))
            done.append(1)
        except Shed:
            pass
    await asyncio.gather(*(one() for _ in range(n)))


def test_two_fronts_never_hold_more_permits_than_the_pool(redis_url):
    async def main(client):
        (ga, la), (gb, lb) = front(client, "a", interval_s=0.01), front(client, "b", interval_s=0.01)
        await la.start()
        await lb.start()
        peak, leased_peak, done, stop = 0, 0, [], False

        async def watch():
            nonlocal peak, leased_peak
            while not stop:
                peak = max(peak, ga.admission.permits.in_use + gb.admission.permits.in_use)
                leases = await client.hgetall(keys()[0])
                leased_peak = max(leased_peak, sum(int(v) for v in leases.values()))
                await asyncio.sleep(0.001)
        watcher = asyncio.ensure_future(watch())
        rng = random.Random(7)
        # Uneven load: front a gets most requests, so its lease must grow past 3.
        await asyncio.gather(_hammer(ga, "heavy", 300, rng, done), _hammer(gb, "light", 60, rng, done))
        stop = True
        await watcher
        await la.stop()
        await lb.stop()
        return peak, leased_peak, len(done), la.total
    peak, leased_peak, done, total = run(redis_url, main)
    assert total == 2 * CAP
    assert leased_peak <= 2 * CAP
    assert peak <= 2 * CAP
    assert peak > CAP  # the busy front did borrow the idle front's permits
    assert done == 360


def test_a_front_that_stops_renewing_gives_its_permits_back(redis_url):
    async def main(client):
        (ga, la), (_, lb) = front(client, "a", ttl_s=0.3), front(client, "b", ttl_s=0.3)
        await la.tick()
        await lb.tick()
        await la.tick()
        before = la.total
        await asyncio.sleep(0.4)  # b is gone: no renewal within its TTL
        await la.tick()
        after = la.total
        return before, after
    assert run(redis_url, main) == (2 * CAP, CAP)


@pytest.mark.quiet
def test_slow_or_lost_redis_degrades_to_safe_local_limits_without_hanging(redis_proc):
    proc, url = redis_proc

    async def main(client):
        gate, leases = front(client, "a", timeout_s=0.2)
        _, other = front(client, "b")
        await leases.tick()
        await other.tick()
        waiting = [asyncio.ensure_future(gate.acquire("t")) for _ in range(2 * CAP)]
        await asyncio.sleep(0.01)  # CAP admitted, CAP queued on front a
        for lease in (leases, other, leases, other, leases):
            await lease.tick()  # a's target grows, b gives its idle permits back
        grown = leases.lease
        for w in waiting:
            (await w).release()
        os.kill(proc.pid, signal.SIGSTOP)  # slow: Redis takes the request and never answers
        try:
            t0 = time.monotonic()
            await leases.tick()
            slow_tick = time.monotonic() - t0
            degraded, capacity = leases.degraded, gate.admission.permits.capacity
            t0 = time.monotonic()
            permit = await gate.acquire("t")  # admission never waits for Redis
            admit_s = time.monotonic() - t0
            permit.release()
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        proc.kill()  # gone
        proc.wait(10)
        t0 = time.monotonic()
        await leases.tick()
        gone_tick = time.monotonic() - t0
        return grown, slow_tick, degraded, capacity, admit_s, gone_tick, leases.degraded, \
            gate.admission.permits.capacity
    out = run(url, main, socket_timeout=1)
    grown, slow_tick, degraded, capacity, admit_s, gone_tick, still_degraded, capacity_after = out
    assert grown > CAP
    assert slow_tick < 1.0 and gone_tick < 1.0
    assert degraded and still_degraded
    assert capacity == CAP and capacity_after == CAP  # its even share of the pool, no more
    assert admit_s < 0.05


def _peers_seen(redis_url, running_a, running_b) -> dict[str, dict]:
    """What colocated fronts a and b see of each other's engines after a, b and a renew, their
    engines running `running_a()` and `running_b()` requests (None: dead)."""
    async def main(client):
        seen: dict[str, dict] = {}
        _, la = front(client, "a")
        _, lb = front(client, "b")
        la.engine, la.on_peers = ("http://a:1", running_a), lambda peers: seen.__setitem__("a", peers)
        lb.engine, lb.on_peers = ("http://b:2", running_b), lambda peers: seen.__setitem__("b", peers)
        await la.tick()
        await lb.tick()
        await la.tick()
        return seen
    return run(redis_url, main)


def test_colocated_fronts_see_each_others_engines(redis_url):
    seen = _peers_seen(redis_url, lambda: 3, lambda: 1)
    assert seen["a"] == {"b": ("http://b:2", 1)}
    assert seen["b"] == {"a": ("http://a:1", 3)}


def test_a_front_whose_engine_died_is_no_peer_to_spill_to(redis_url):
    seen = _peers_seen(redis_url, lambda: None, lambda: 1)
    assert seen["a"] == {"b": ("http://b:2", 1)}  # it still spills to the live one
    assert seen["b"] == {}  # running None: its engine died (deployments/replica.py `_running`)


def test_a_front_whose_loop_lags_grants_fewer_permits_than_its_lease(redis_url):
    from deployments.admission.lag_limit import LagLimit

    async def main(client):
        limit = LagLimit(floor=1, interval_s=0.01)
        gate, leases = front(client, "a", limit=limit)
        await leases.tick()
        held = [await gate.acquire("t") for _ in range(CAP)]
        assert leases.lease == CAP and gate.snapshot().capacity == CAP
        await asyncio.sleep(0.02)
        for _ in range(3):
            limit.observe(0.05)  # the loop woke 50 ms late: half the 3 in flight, rounded
        await leases.tick()
        cut = gate.snapshot().capacity, leases.lease
        for p in held:
            p.release()
        late = asyncio.ensure_future(gate.acquire("t", deadline_s=5))
        queued = [await gate.acquire("t") for _ in range(2)]  # only two permits now
        await asyncio.sleep(0.01)
        waiting = not late.done()
        await asyncio.sleep(0.02)
        for _ in range(3):
            limit.observe(0.0)  # on time again: the limit grows and, at the lease, lets go
        await leases.tick()
        third = await asyncio.wait_for(late, 1)
        for p in (*queued, third):
            p.release()
        return cut, waiting, gate.snapshot().capacity, limit.limit

    cut, waiting, capacity, lim = run(redis_url, main)
    assert cut == (2, CAP) and waiting  # the lease is unchanged: only the local pool shrank
    assert capacity == CAP and lim == float("inf")


def test_offered_load_follows_the_arrival_rate():
    from deployments.admission.permit_leases import OfferedLoad

    load = OfferedLoad(time_constant_s=0.5)
    n = 0
    for step in range(100):  # 20 requests/s for 5 s, in 50 ms renewals
        rates = load.update({"a": n, "b": 0}, step * 0.05)
        n += 1
    assert abs(rates["a"] - 20.0) < 0.5 and rates["b"] == 0.0
