"""What the site simulator measures (bench/sites/sites_sim.py): one Recorder per policy run.

Counted from ``warmup_s`` on (requests by their arrival time, busy permits
integrated over time):
  - requests, served, rejected (out of capacity: no site took the request),
    rejected by origin, the forwards refused by a full or dead site;
  - utilisation per site: busy permit-seconds / (permits x measured seconds),
    its max, mean and max/mean across sites;
  - added RTT: the round trip a served request paid to reach the site that
    ran it (0 when its origin ran it), over all served requests and over the
    forwarded ones, in ms and in neighbour hops. A hop is measured two ways:
    from the request's origin to *its* nearest other site (``origin_hops``)
    and the fleet's typical hop, the median over sites of that distance
    (``fleet_hops``);
  - queue wait of the served requests (arrival at the site to a permit);
  - session keep: of the served turns 2+ whose session had a site, the
    share served on that site (the previous turn's).
"""

from __future__ import annotations

from collections import Counter

from bench.sites.sites_geo import City, fleet_hop_s, neighbour_hop_s
from common.stats import percentile


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


class Recorder:
    """Counters and samples of one run; ``summary`` turns them into the JSON-ready metrics."""

    def __init__(self, cities: list[City], warmup_s: float, hotspot: str) -> None:
        self.names = [c.name for c in cities]
        self.permits = [c.permits for c in cities]
        self.hotspot = hotspot
        self.warmup_s = warmup_s
        hop = neighbour_hop_s(cities)
        self.origin_hop = [hop[n] for n in self.names]
        self.fleet_hop = fleet_hop_s(cities)
        self._busy = [0] * len(cities)
        self._last = [0.0] * len(cities)
        self._area = [0.0] * len(cities)
        self.requests = 0
        self.rejected_by = Counter()
        self.refusals = 0
        self.reasons: Counter = Counter()
        self.rtts: list[float] = []
        self.fwd_rtts: list[float] = []
        self.fwd_origin_hops: list[float] = []
        self.waits: list[float] = []
        self.later_turns = 0
        self.kept = 0

    def busy(self, t: float, j: int, delta: int) -> None:
        """Site ``j``'s busy permits change by ``delta`` at ``t``; integrates the time before."""
        lo = max(self._last[j], self.warmup_s)
        if t > lo:
            self._area[j] += self._busy[j] * (t - lo)
        self._last[j] = t
        self._busy[j] += delta

    def served(self, t: float, origin: int, j: int, reason: str, rtt_s: float, turn: int,
               session_site: str | None) -> None:
        """A request that reached ``origin`` at ``t`` was admitted at site ``j``."""
        if t < self.warmup_s:
            return
        self.requests += 1
        self.reasons[reason] += 1
        self.rtts.append(rtt_s)
        if j != origin:
            self.fwd_rtts.append(rtt_s)
            self.fwd_origin_hops.append(rtt_s / self.origin_hop[origin])
        if turn > 0 and session_site is not None:
            self.later_turns += 1
            self.kept += self.names[j] == session_site

    def rejected(self, t: float, origin: int, turn: int) -> None:
        """A request that reached ``origin`` at ``t`` was rejected: out of capacity."""
        if t >= self.warmup_s:
            self.requests += 1
            self.reasons["rejected"] += 1
            self.rejected_by[self.names[origin]] += 1

    def refused(self, t: float) -> None:
        """A forward was refused by its site (the origin may try again)."""
        if t >= self.warmup_s:
            self.refusals += 1

    def waited(self, arrived: float, wait_s: float) -> None:
        """A request that arrived at ``arrived`` got its permit after ``wait_s``."""
        if arrived >= self.warmup_s:
            self.waits.append(wait_s)

    def summary(self, end_s: float) -> dict:
        """The run's metrics (module docstring); the busy integrals are closed at ``end_s``."""
        span = end_s - self.warmup_s
        for j in range(len(self.names)):
            self.busy(end_s, j, 0)
        util = {n: self._area[j] / (self.permits[j] * span) for j, n in enumerate(self.names)}
        mean = sum(util.values()) / len(util)
        rejected = sum(self.rejected_by.values())
        fwd_ms = [1000 * r for r in self.fwd_rtts]
        return {
            "requests": self.requests,
            "served": self.requests - rejected,
            "rejected": rejected,
            "rejected_at_hotspot": self.rejected_by.get(self.hotspot, 0),
            "rejected_elsewhere": rejected - self.rejected_by.get(self.hotspot, 0),
            "refused_forwards": self.refusals,
            "reasons": dict(sorted(self.reasons.items())),
            "util_max": _r(max(util.values())),
            "util_max_site": max(util, key=util.get),
            "util_mean": _r(mean),
            "util_max_over_mean": _r(max(util.values()) / mean if mean else None, 3),
            "util_hotspot": _r(util.get(self.hotspot)),
            "forwarded_share": _r(len(self.fwd_rtts) / len(self.rtts) if self.rtts else 0.0),
            "added_rtt_ms": {
                "all_p50": _r(1000 * (percentile(self.rtts, 50) or 0.0), 2),
                "all_p90": _r(1000 * (percentile(self.rtts, 90) or 0.0), 2),
                "forwarded_p50": _r(percentile(fwd_ms, 50), 2),
                "forwarded_p90": _r(percentile(fwd_ms, 90), 2),
            },
            "added_rtt_hops": {
                "fleet_hop_ms": _r(1000 * self.fleet_hop, 2),
                "forwarded_p50_fleet_hops": _r((percentile(fwd_ms, 50) or 0) / (1000 * self.fleet_hop), 2)
                if fwd_ms else None,
                "forwarded_p50_origin_hops": _r(percentile(self.fwd_origin_hops, 50), 2),
            },
            "queue_wait_s": {q: _r(percentile(self.waits, v), 3) for q, v in (("p50", 50), ("p90", 90), ("p99", 99))},
            "session_keep": _r(self.kept / self.later_turns if self.later_turns else None),
            "session_turns_2plus": self.later_turns,
            "utilisation": {n: round(u, 4) for n, u in util.items()},
        }
