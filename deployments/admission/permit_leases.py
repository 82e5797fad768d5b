"""Engine permits shared by every front through Redis leases.

Any front may send a request to any decode replica's engine (disaggregated:
by the routing policy; colocated: by spilling, below), so the permits belong
to the pool (``capacity_per_replica`` times the live fronts, one per decode
replica), not to a front. Each front holds a *lease*:
a number of the pool's permits that its local ``Admission`` may grant. A
request is admitted or refused by the local fair queue alone, so the request
path never waits for Redis; the leases move in the background:

    every ``interval_s``: publish my demand per tenant (the permits it would
    hold: its arrival rate times the service time, or its backlog), ask for
    max(in use, my target) permits, read every front's demand back,
    recompute my target (deployments/admission/lease_plan.py)

One Lua script does it atomically, so the leases of all fronts never add up
to more than the pool: a front may grow only into permits nobody holds, and
shrinks only down to what it has in use. A front's entry expires after
``ttl_s`` without a renewal (a dead front gives its permits back; the pool
shrinks by its share). Time is Redis's own clock, so nodes need not agree.

A front whose own process cannot keep up (its event loop wakes late) grants fewer
permits than its lease: ``limit`` (deployments/admission/lag_limit.py) caps the
local pool at each renewal, without changing what the front asks of the pool.

Colocated fronts also publish their engine's internal URL and running
requests, so a front holding more permits than its own engine should run
can spill requests to a peer engine with room (routing/policy/spill.py).

When Redis is slow or gone the front keeps serving from its last lease,
capped at its even share of the pool (``capacity_per_replica``): every front
falls back to that at the same time, so together they still hold no more
than the pool. Nothing waits longer than ``timeout_s`` for Redis.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from typing import NamedTuple

import redis

from common.config import AdmissionConfig
from deployments.admission import AsyncAdmission
from deployments.admission.lag_limit import LagLimit
from deployments.admission.lease_plan import plan_targets

log = logging.getLogger("baton.leases")
PREFIX = "baton:permits:"

_LEASE = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local me = ARGV[1]
local exp = redis.call('HGETALL', KEYS[2])
for i = 1, #exp, 2 do
  if exp[i] ~= me and tonumber(exp[i + 1]) < now_ms then
    redis.call('HDEL', KEYS[1], exp[i])
    redis.call('HDEL', KEYS[2], exp[i])
    redis.call('HDEL', KEYS[3], exp[i])
  end
end
redis.call('HSET', KEYS[2], me, now_ms + tonumber(ARGV[4]))
redis.call('HSET', KEYS[3], me, ARGV[5])
local others = 0
local leases = redis.call('HGETALL', KEYS[1])
for i = 1, #leases, 2 do
  if leases[i] ~= me then others = others + tonumber(leases[i + 1]) end
end
local total = tonumber(ARGV[3]) * redis.call('HLEN', KEYS[2])
local grant = math.min(tonumber(ARGV[2]), math.max(0, total - others))
redis.call('HSET', KEYS[1], me, grant)
return {grant, total, redis.call('HGETALL', KEYS[3])}
"""


class Peer(NamedTuple):
    """Another colocated front's engine, as its last renewal published it."""

    url: str  # its internal server
    running: int  # requests in its engine


def keys(pool: str = "decode") -> list[str]:
    """The three hashes of a pool's leases: front -> permits, expiry (ms), demand."""
    return [f"{PREFIX}{pool}:lease", f"{PREFIX}{pool}:expiry", f"{PREFIX}{pool}:demand"]


class PermitLeases:
    """Keeps one front's ``AsyncAdmission`` sized to its lease of the pool.

    ``start`` takes the first lease (or the safe local share if Redis does
    not answer) and starts the background loop; ``stop`` gives the lease back.
    Call everything from the gate's event loop.
    """

    def __init__(self, client, front: str, config: AdmissionConfig, gate: AsyncAdmission,
                 interval_s: float = 0.05, ttl_s: float = 10.0, timeout_s: float = 0.25,
                 engine: tuple[str, Callable[[], int]] | None = None,
                 on_peers: Callable[[dict[str, Peer]], None] | None = None,
                 limit: LagLimit | None = None) -> None:
        self.r, self.front, self.config, self.gate = client, front, config, gate
        self.interval_s, self.ttl_s, self.timeout_s = interval_s, ttl_s, timeout_s
        self.engine = engine  # (internal URL, running requests or None once dead) of this front's engine, if colocated
        self.on_peers = on_peers  # gets the other fronts' engines after each renewal
        self.limit = limit  # the permits this front's loop lag allows, at most its lease
        self._lagging = False  # the limit is below the lease
        self.safe = config.capacity  # this front's even share of the pool
        self.lease = 0
        self.target = self.safe
        self.total = self.safe
        self.degraded = False  # True while Redis does not answer
        self.offered = OfferedLoad()
        self._script = client.register_script(_LEASE)
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Take the first lease, then renew it every ``interval_s``."""
        await self.tick()
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        """Stop renewing and give the lease back (best effort)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        try:
            pipe = self.r.pipeline(transaction=False)
            for key in keys():
                pipe.hdel(key, self.front)
            await asyncio.wait_for(pipe.execute(), self.timeout_s)
        except (redis.RedisError, OSError, asyncio.TimeoutError):
            pass  # the entry expires after ttl_s

    async def tick(self) -> None:
        """One renewal: publish demand, resize the local pool to the grant.

        Changes the lease in Redis and the gate's capacity; on a Redis error
        or timeout, caps the gate at the safe local share instead.
        """
        snap = self.gate.snapshot()
        rates = self.offered.update({t: s.stats.submitted for t, s in snap.tenants.items()}, time.monotonic())
        service = snap.service_time_s or 0.0
        demand = {t: max(s.in_use + s.queue_len, rates.get(t, 0.0) * service) for t, s in snap.tenants.items()}
        mine: dict = {"t": {t: round(d, 2) for t, d in demand.items() if d > 0}}
        if self.engine is not None and (running := self.engine[1]()) is not None:  # None: its engine died
            mine["url"], mine["run"] = self.engine[0], running
        want = max(snap.permits_in_use, self.target)
        try:
            grant, total, flat = await asyncio.wait_for(self._script(
                keys=keys(), args=[self.front, want, self.safe, int(self.ttl_s * 1000),
                                   json.dumps(mine)]), self.timeout_s)
        except (redis.RedisError, OSError, asyncio.TimeoutError) as exc:
            if not self.degraded:
                log.warning("permit leases: Redis does not answer (%s); holding at most %d permits",
                            type(exc).__name__, min(self.lease, self.safe) if self.lease else self.safe)
            self.degraded = True
            self.lease = min(self.lease, self.safe) if self.lease else self.safe
            self._grant(self.lease, snap.permits_in_use)
            if self.on_peers is not None:
                self.on_peers({})  # no view of the peers: run on the own engine only
            return
        self.degraded = False
        self.lease, self.total = int(grant), int(total)
        fronts = {_s(flat[i]): json.loads(flat[i + 1]) for i in range(0, len(flat), 2)}
        demand = {f: entry.get("t", {}) for f, entry in fronts.items()}
        self.target = plan_targets(self.total, demand, self.config.weight_of).get(self.front, 0)
        # Grant no more than the target: a front over it gives permits back as
        # its requests finish, instead of handing them to its own queue.
        self._grant(min(self.lease, self.target), snap.permits_in_use, self.target)
        if self.on_peers is not None:
            self.on_peers({f: Peer(e["url"], int(e.get("run", 0))) for f, e in fronts.items()
                           if f != self.front and e.get("url")})

    def _grant(self, permits: int, in_use: int, servers: int | None = None) -> None:
        """Sizes the gate to `permits`, or fewer where the loop's lag `limit` says so; `servers`
        (default: the permits) is what the queue's wait estimate divides by."""
        if self.limit is not None:
            limited = self.limit.step(time.monotonic(), in_use, permits)
            if (limited < permits) != self._lagging:
                self._lagging = limited < permits
                log.info("permit leases: %s", f"the event loop lags; granting {limited} of {permits} permits"
                         if self._lagging else "the event loop keeps up again; granting the lease")
            if limited < permits:
                permits = servers = limited
        self.gate.set_capacity(permits, servers=max(1, permits if servers is None else servers))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the loop must outlive one bad tick
                log.exception("permit leases: tick failed")


class OfferedLoad:
    """Requests per second each tenant sends this front (EWMA over renewals).

    A front's backlog is capped by the deadline, so it says little about how
    much a tenant asks for; the arrival rate times the service time does
    (Little's law: the permits the tenant would hold if all were admitted).
    """

    def __init__(self, time_constant_s: float = 1.0) -> None:
        self.tau = time_constant_s
        self.rates: dict[str, float] = {}
        self._last: dict[str, int] = {}
        self._at: float | None = None

    def update(self, submitted: dict[str, int], now: float) -> dict[str, float]:
        """Fold the counts since the last call into the rates; returns them. Changes them."""
        if self._at is not None and now > self._at:
            dt = now - self._at
            alpha = 1 - math.exp(-dt / self.tau)
            for t, n in submitted.items():
                rate = (n - self._last.get(t, n)) / dt
                self.rates[t] = self.rates.get(t, 0.0) + alpha * (rate - self.rates.get(t, 0.0))
        self._last, self._at = dict(submitted), now
        return self.rates


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
