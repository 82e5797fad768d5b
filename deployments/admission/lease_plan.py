"""How many of the pool's permits each front should hold: one view across fronts.

Every front (ingress replica) publishes its demand per tenant (requests
holding a permit plus requests queued) to a shared store, and reads every
other front's. From that one view each front computes the same plan:

1. each tenant's weighted max-min fair share of the whole pool, from its
   demand summed over fronts (``max_min_fair_share``);
2. a front's share of a tenant's fair share is proportional to the part of
   the tenant's demand it holds;
3. permits nobody asks for (the pool minus the demand) are spread evenly, so
   a front with an idle moment still admits its next request at once;
4. fractions are rounded by largest remainder, ties by front name, so the
   targets are integers that add up to the pool exactly; a front with
   requests gets at least one permit while another front has several.

The plan only steers: fronts lease toward their target from the shared
store, which never grants more than the pool (deployments/admission/permit_leases.py).
Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from .simulate import max_min_fair_share


def plan_targets(total: int, demand: Mapping[str, Mapping[str, float]],
                 weight_of: Callable[[str], float]) -> dict[str, int]:
    """Permits each front should hold: front -> target, summing to ``total``.

    ``demand`` is front -> tenant -> permits the tenant asks for there (any
    non-negative number; every live front appears, idle ones with an empty
    mapping). Changes nothing.
    """
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    fronts = sorted(demand)
    if not fronts:
        return {}
    by_tenant: dict[str, float] = {}
    for per in demand.values():
        for tenant, n in per.items():
            if n > 0:
                by_tenant[tenant] = by_tenant.get(tenant, 0) + n
    shares = max_min_fair_share(by_tenant, {t: weight_of(t) for t in by_tenant}, float(total))
    raw = {f: 0.0 for f in fronts}
    for f in fronts:
        for tenant, n in demand[f].items():
            if n > 0:
                raw[f] += shares[tenant] * n / by_tenant[tenant]
    spare = max(0.0, total - sum(raw.values()))
    for f in fronts:
        raw[f] += spare / len(fronts)
    out = _round(raw, total)
    for f in fronts:  # a front with requests gets at least one permit while another has several
        if out[f] == 0 and any(n > 0 for n in demand[f].values()):
            richest = max(fronts, key=lambda g: (out[g], g))
            if out[richest] > 1:
                out[richest] -= 1
                out[f] = 1
    return out


def _round(raw: dict[str, float], total: int) -> dict[str, int]:
    """Largest-remainder rounding of ``raw`` to integers summing to ``total``."""
    out = {f: math.floor(v + 1e-9) for f, v in raw.items()}
    left = total - sum(out.values())
    order = sorted(raw, key=lambda f: (-(raw[f] - out[f]), f))
    for f in order[:max(0, left)]:
        out[f] += 1
    return out
