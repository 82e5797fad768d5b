"""Deterministic overload simulation that drives the real ``Admission``.

Each tenant sends requests at a fixed rate (evenly spaced, tenant ``i`` offset
by ``(i+1)/(n+1)`` of its interval so arrivals never coincide by accident);
every admitted request holds its permit for exactly ``service_time_s``. The
result reports, per tenant, successes, sheds by reason, goodput and its fair
share of throughput, so tests (and ``baton bench overload``) can check "a
light tenant keeps >= 90% of its fair share". The fair share follows the
queue's rules: tiers take capacity in strict priority order, and within a
tier tenants get the weighted max-min share by tenant weight.

Pure: no clock, no randomness; the same inputs give the same numbers.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass

from .admission import Admission
from common.config import AdmissionConfig
from .outcomes import ShedReason
from .ticket import Ticket


@dataclass(frozen=True)
class TenantOutcome:
    offered: int  # requests sent
    successes: int  # admitted and completed
    shed: dict[ShedReason, int]
    goodput_rps: float  # successes / duration
    fair_share_rps: float  # weighted max-min fair share of capacity
    fair_share_ratio: float  # goodput / fair share (inf if the share is 0)


@dataclass(frozen=True)
class OverloadResult:
    capacity_rps: float  # permits / service time
    duration_s: float
    tenants: dict[str, TenantOutcome]


def max_min_fair_share(demand: Mapping[str, float], weights: Mapping[str, float],
                       capacity: float) -> dict[str, float]:
    """Weighted water-filling: no tenant gets more than it asks for, and
    capacity left by light tenants is split among the rest by weight."""
    share = {t: 0.0 for t in demand}
    active = {t for t, d in demand.items() if d > 0}
    left = capacity
    while active and left > 1e-12:
        total_w = sum(weights[t] for t in active)
        sated = {t for t in active if demand[t] - share[t] <= left * weights[t] / total_w}
        if not sated:
            for t in active:
                share[t] += left * weights[t] / total_w
            break
        for t in sated:
            left -= demand[t] - share[t]
            share[t] = demand[t]
        active -= sated
    return share


def priority_fair_share(config: AdmissionConfig, demand: Mapping[str, float],
                        requested: Mapping[str, str], capacity: float) -> dict[str, float]:
    """Fair share per tenant under the queue's rules: each tier, highest first,
    water-fills what the tiers above left, by tenant weight. ``requested``
    maps tenant -> requested tier (``config.tier_of`` resolves it)."""
    tier = {t: config.tier_of(t, requested.get(t)) for t in demand}
    share: dict[str, float] = {}
    left = capacity
    for name in config.tiers:
        members = {t: d for t, d in demand.items() if tier[t] == name}
        got = max_min_fair_share(members, {t: config.weight_of(t) for t in members}, left)
        share.update(got)
        left = max(0.0, left - sum(got.values()))
    return share


def two_tenant_load(load_x: float, capacity_rps: float,
                    heavy_factor: float = 10.0) -> dict[str, float]:
    """Offered rates for "light" and "heavy" (heavy sends ``heavy_factor`` x light)
    adding up to ``load_x`` times capacity."""
    light = load_x * capacity_rps / (1 + heavy_factor)
    return {"light": light, "heavy": heavy_factor * light}


def _arrivals(offered_rps: Mapping[str, float], duration_s: float) -> list[tuple[float, int, int, object]]:
    """Evenly spaced arrivals per tenant, staggered between tenants, as a heap.

    Entries are (time, kind, seq, payload): kind 0 = completion, 1 = arrival,
    so a permit freed at time t is free for an arrival at the same t.
    """
    events: list[tuple[float, int, int, object]] = []
    n = len(offered_rps)
    for i, (tenant, rate) in enumerate(offered_rps.items()):
        if rate <= 0:
            continue
        interval = 1.0 / rate
        for k in range(math.ceil(duration_s * rate) + 1):
            at = (k + (i + 1) / (n + 1)) * interval
            if at < duration_s:
                events.append((at, 1, len(events), tenant))
    heapq.heapify(events)
    return events


def simulate_overload(config: AdmissionConfig, offered_rps: Mapping[str, float],
                      service_time_s: float, duration_s: float, replicas: int = 1,
                      tiers: Mapping[str, str] | None = None,
                      deadline_s: float | None = None) -> OverloadResult:
    """Run arrivals in ``[0, duration_s)`` to completion; return per-tenant outcomes.

    ``tiers`` maps tenant -> requested priority tier (else the tenant's own;
    see ``AdmissionConfig.tier_of``). Changes nothing outside the
    ``Admission`` it builds.
    """
    if service_time_s <= 0 or duration_s <= 0:
        raise ValueError("service_time_s and duration_s must be positive")
    adm = Admission(config, replicas)
    tiers = dict(tiers or {})
    events = _arrivals(offered_rps, duration_s)
    seq = len(events)
    offered = {t: 0 for t in offered_rps}
    successes = {t: 0 for t in offered_rps}

    def start(tickets: list[Ticket], now: float) -> None:
        nonlocal seq
        for t in tickets:
            heapq.heappush(events, (now + service_time_s, 0, seq, t))
            seq += 1

    while events:
        now, kind, _, payload = heapq.heappop(events)
        if kind == 1:
            tenant = str(payload)
            offered[tenant] += 1
            ticket = adm.submit(tenant, tiers.get(tenant), now, deadline_s)
            if ticket.admitted:
                start([ticket], now)
        else:
            assert isinstance(payload, Ticket)
            successes[payload.tenant] += 1
            start(adm.release(payload, now).admitted, now)
    adm.expire(math.inf)  # nothing should be left; count it as expired if so

    capacity_rps = adm.permits.capacity / service_time_s
    fair = priority_fair_share(config, offered_rps, tiers, capacity_rps)
    tenants = {}
    for t in offered_rps:
        st = adm.stats.get(t)
        goodput = successes[t] / duration_s
        tenants[t] = TenantOutcome(
            offered=offered[t], successes=successes[t],
            shed=dict(st.shed) if st else {},
            goodput_rps=goodput, fair_share_rps=fair[t],
            fair_share_ratio=goodput / fair[t] if fair[t] > 0 else math.inf,
        )
    return OverloadResult(capacity_rps, duration_s, tenants)
