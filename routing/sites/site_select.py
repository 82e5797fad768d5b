"""Which site serves a request: its own, its session's, or a random near one.

A *site* is one Baton deployment. The front that receives a request (its
*origin*) decides where it runs from three inputs passed in: the sites'
``SiteView`` (permits free and total, how long a new request would queue,
alive), the ``LatencyMap`` of measured RTTs, and ``now``. Randomness comes
from an injected RNG. The rules, in order (``SiteSelector.choose``):

1. Session: a turn of a session goes back to the site that served its
   previous turn (its prefix cache is there) while that site can serve it.
   The origin itself, whose view is exact: a free permit or a queue wait
   within ``max_queue_wait_s``. Another site: alive and reachable (an
   unexpired RTT), whatever its view says of its queue; while it is backed
   off, only a view heard after its last refusal that shows a free permit
   will do. A view of another site is a probe old, often older than a
   request's service time, and a full queue is often full for a moment:
   the session's prefix is worth a round trip to find out (a turn refused
   there is chosen again, rules 2-6). A site that stopped answering sends
   no newer view. Sessions are never moved for balance; balance is made
   with new work.
2. Local: the origin serves the request itself when it has a free permit
   and is not *hot*. Hot = its load is above its spill point and some near
   site with a free permit is at least ``balance_margin`` less loaded (a
   *cooler* site). The spill point is ``spill_busy``, or lower for a small
   site: the load at which a new request's chance of queueing there (Erlang
   C over its permits) reaches ``spill_wait_chance``. A 2-permit site queues
   a third of its arrivals at 0.47 busy; a 32-permit one at 0.86. Load is
   the busy fraction (1 - free/total) averaged over about a session's life
   (``SiteView.busy_avg``), or the instantaneous one where a site does not
   report the average. So a site spills only when it
   is loaded *and* a neighbour is better off: a 5x hotspot sheds to its
   ring, the ring, now loaded, sheds its own new work one hop further, and
   the excess diffuses over several hops while each request makes one.
   The average matters because sessions stay: a site judged on its
   momentary busy fraction takes new sessions whenever it dips (their
   later turns are not in flight yet, they think) and ends up full of
   their turns.
3. Spill: a random cooler near site (any near site with a free permit when
   the origin has none), weighted by its free capacity
   ``permits_free / (1 + queue_wait_s / wait_scale_s)``. The draw
   (not "the emptiest") keeps fronts that read the same views, seconds
   old, from all picking the same neighbour.
   Wait or pay the round trip: when the origin has no free permit, its
   expected wait is its ``queue_wait_s``; a neighbour is worth the trip
   only if ``rtt + its queue_wait_s + forward_overhead_s`` is shorter. If
   none is, the request waits in the local queue ("wait_local") when that
   queue admits it (wait <= ``max_queue_wait_s``).
4. Remote queue: when the local queue is too long too, the near site whose
   queue admits the request with the least ``rtt + queue_wait_s``.
5. Far: when no near site can take it either, the live sites beyond the near
   set but within ``near_max_rtt_s``: a capacity-weighted draw among those
   with a free permit, else the queue with the least ``rtt + queue_wait_s``.
   A region of few sites (Sydney's near set is Melbourne and Brisbane) sheds
   past its ring only then, not for balance.
6. Otherwise reject: out of capacity.

Near set of an origin: the live neighbours in the latency map (unexpired)
that are in ``views`` with alive=True, not in backoff, and at most
``near_max_rtt_s`` away; of those the ``near_k`` nearest within
``near_slack_s`` of the nearest one.

A refused forward comes back to the origin, which chooses again with the
refusing site backed off, up to ``max_attempts`` choices a request (the
other near sites, or its own queue, before a 429).

Backoff: a site that refuses a forwarded request (``refused``) is skipped
for ``backoff_base_s * 2**(refusals - 1)``, at most ``backoff_max_s``;
``served`` ends it and resets the count. Pure: no clock, no I/O.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

from routing.sites.latency_map import LatencyMap
from routing.sites.site_backoff import Backoff
from routing.sites.queueing import busy_at_wait_chance


@dataclass(frozen=True)
class SiteView:
    """One site's load as the origin last heard it.

    ``queue_wait_s``: how long the site's admission queue would make a request
    admitted now wait for a permit (0 when a permit is free or nothing queues).
    ``alive``: False once the site's reports have stopped. ``busy_avg``: the
    site's busy fraction (1 - free/total) averaged over about a session's life
    (an EWMA the site keeps); None where not reported, and ``load`` is then the
    instantaneous fraction. ``as_of``: when the origin heard it (None: unknown,
    taken as older than any refusal). ``queue_full_for``: tenants whose own queue there is at
    its bound (the site's admission refuses them a place even where the total has room).
    """

    name: str
    permits_free: int
    permits_total: int
    queue_wait_s: float = 0.0
    alive: bool = True
    busy_avg: float | None = None
    as_of: float | None = None
    queue_full_for: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.permits_total < 0 or not 0 <= self.permits_free <= self.permits_total:
            raise ValueError(f"{self.name}: need 0 <= permits_free <= permits_total")
        if not 0.0 <= self.queue_wait_s <= math.inf:
            raise ValueError(f"{self.name}: queue_wait_s must be >= 0")
        if self.busy_avg is not None and not 0.0 <= self.busy_avg <= 1.0:
            raise ValueError(f"{self.name}: busy_avg must be in [0, 1]")

    @property
    def busy_fraction(self) -> float:
        """1 - free/total; 1.0 for a site with no permits."""
        return 1.0 - self.permits_free / self.permits_total if self.permits_total else 1.0

    def for_tenant(self, tenant: str | None) -> "SiteView":
        """This view as a request of ``tenant`` finds it: no queue (an endless wait) where no
        permit is free and the tenant's queue is full; else unchanged. Reads only."""
        if tenant is None or self.permits_free or tenant not in self.queue_full_for:
            return self
        return dataclasses.replace(self, queue_wait_s=math.inf)

    @property
    def load(self) -> float:
        """What the hot rule compares: ``busy_avg`` when reported, else ``busy_fraction``."""
        return self.busy_fraction if self.busy_avg is None else self.busy_avg


@dataclass(frozen=True)
class SiteDecision:
    """Where a request goes: ``site`` None means rejected (out of capacity).

    ``reason``: "session" | "local" | "spill" | "wait_local" | "queue_remote" | "far" | "rejected"
    (baselines: "local" | "nearest" | "rejected"). ``rtt_s``: the round trip the
    request pays to get there (0 when served by its origin).
    """

    site: str | None
    reason: str
    rtt_s: float = 0.0


@dataclass(frozen=True)
class SiteSelectConfig:
    """Parameters of the site policy; see the module docstring for where each applies."""

    # Near set: the 8 nearest within 10 ms of the nearest, none beyond 80 ms. In a dense
    # region (Europe, the US east coast) that is a ring of cities 1-10 ms apart; an isolated
    # site (Honolulu, Auckland) still gets the few 40-50 ms away. Beyond ~80 ms the trip
    # costs more than most queues and crosses an ocean.
    near_k: int = 8
    near_slack_s: float = 0.010
    near_max_rtt_s: float = 0.080
    # Hot: a load (busy fraction averaged over about a session's life) over 60%, and a near
    # site with a free permit at least 5 points less loaded. Below 60% a site never spills
    # (sites are provisioned for their own peak; no trip for a load every site carries).
    # The margin is per hop: a hotspot sheds to its ring, the ring (now loaded) sheds its own
    # new work one hop further, so the excess diffuses over several hops while each request
    # travels one. With 10 points the 5x Frankfurt hotspot of `baton bench sites` settled at
    # 0.79 busy (its ring at 0.70); with 5 points at 0.71 (ring 0.67): the excess has to
    # reach most of Europe. The averaged load moves slowly, so 5 points is not noise.
    spill_busy: float = 0.6
    balance_margin: float = 0.05
    # ... but a small site queues at lower loads: it spills from where a new request's chance of
    # waiting (Erlang C over its permits) reaches 0.3, if that comes before spill_busy. Sites of
    # 4 permits or more reach it above 0.6, so only 1-3-permit sites spill earlier.
    spill_wait_chance: float = 0.3
    # A queue wait is worth 1 s of free capacity: weight halves per second of reported wait.
    wait_scale_s: float = 1.0
    # Forwarding's own cost beyond the RTT (one more HTTP hop through a front).
    forward_overhead_s: float = 0.005
    # The longest wait a site's admission queue accepts (its queue deadline); beyond it
    # the site refuses. A session's site is kept while its wait is within this too.
    max_queue_wait_s: float = 2.0
    # Backoff after a refusal: 1 s, 2 s, 4 s ... at most 30 s (about one probe TTL).
    backoff_base_s: float = 1.0
    backoff_max_s: float = 30.0
    # Choices a request gets: after a refused forward the origin chooses again (the refuser
    # backed off). Two: the other near site or the origin's queue, then the origin answers.
    max_attempts: int = 2

    def __post_init__(self) -> None:
        if self.near_k < 1 or self.max_attempts < 1:
            raise ValueError("near_k and max_attempts must be >= 1")
        if min(self.near_slack_s, self.near_max_rtt_s, self.forward_overhead_s, self.max_queue_wait_s) < 0:
            raise ValueError("near_slack_s, near_max_rtt_s, forward_overhead_s, max_queue_wait_s must be >= 0")
        if not 0.0 <= self.spill_busy <= 1.0 or not 0.0 <= self.balance_margin <= 1.0:
            raise ValueError("spill_busy and balance_margin must be in [0, 1]")
        if not 0.0 < self.spill_wait_chance < 1.0:
            raise ValueError("spill_wait_chance must be in (0, 1)")
        if self.wait_scale_s <= 0:
            raise ValueError("wait_scale_s must be > 0")
        if not 0 < self.backoff_base_s <= self.backoff_max_s:
            raise ValueError("need 0 < backoff_base_s <= backoff_max_s")

    def spill_point(self, permits: int) -> float:
        """The load above which a site of ``permits`` may spill: ``spill_busy``, or where a new
        request's chance of queueing there reaches ``spill_wait_chance`` if that is lower."""
        if permits < 1:
            return self.spill_busy
        return min(self.spill_busy, busy_at_wait_chance(permits, self.spill_wait_chance))


def can_queue(view: SiteView | None, max_wait_s: float) -> bool:
    """Alive with permits, and a free permit or a queue wait within ``max_wait_s``."""
    return (view is not None and view.alive and view.permits_total > 0
            and (view.permits_free > 0 or view.queue_wait_s <= max_wait_s))


class SiteSelector:
    """The random-near site policy. Holds its config, RNG and the backoff table."""

    def __init__(self, config: SiteSelectConfig | None = None, rng: random.Random | None = None) -> None:
        self.config = config or SiteSelectConfig()
        self.rng = rng or random.Random(0)
        self.backoff = Backoff(self.config.backoff_base_s, self.config.backoff_max_s)

    def refused(self, site: str, now: float) -> None:
        """``site`` refused a request sent to it: starts or doubles its backoff."""
        self.backoff.refused(site, now)

    def served(self, site: str, now: float) -> None:
        """``site`` admitted a request sent to it: clears its backoff."""
        self.backoff.served(site)

    def near(self, origin: str, views: dict[str, SiteView], latency: LatencyMap,
             now: float) -> list[tuple[str, float]]:
        """The origin's near set as (site, rtt_s), nearest first (see the module docstring). Reads only."""
        return self._reach(origin, views, latency, now)[0]

    def _reach(self, origin: str, views: dict[str, SiteView], latency: LatencyMap,
               now: float) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
        """(near set, the usable sites beyond it within ``near_max_rtt_s``), nearest first."""
        cfg = self.config
        usable = [(n, r) for n, r in latency.neighbours(origin, now)
                  if r <= cfg.near_max_rtt_s and n in views and views[n].alive
                  and views[n].permits_total > 0 and not self.backoff.active(n, now)]
        if not usable:
            return [], []
        limit = usable[0][1] + cfg.near_slack_s
        near = [(n, r) for n, r in usable[:cfg.near_k] if r <= limit]
        return near, usable[len(near):]

    def choose(self, origin: str, views: dict[str, SiteView], latency: LatencyMap, now: float,
               session_site: str | None = None) -> SiteDecision:
        """Where the request that reached ``origin`` runs (rules 1-6 of the module docstring).

        ``session_site``: the site that served the session's previous turn, if any.
        Changes only the RNG state (a spill draw); views and the map are read.
        """
        cfg = self.config
        if session_site is not None:
            kept = self._session(origin, session_site, views, latency, now)
            if kept is not None:
                return kept
        local = views.get(origin)
        local_ok = local is not None and local.alive and local.permits_total > 0
        near, far = self._reach(origin, views, latency, now)
        pick = self._spill(local if local_ok else None, near, views)
        if pick is not None:
            return SiteDecision(pick[0], "spill", pick[1])
        if local_ok and local.permits_free > 0:
            return SiteDecision(origin, "local", 0.0)
        if local_ok and local.queue_wait_s <= cfg.max_queue_wait_s:
            return SiteDecision(origin, "wait_local", 0.0)
        queue = self._queue(near, views)
        if queue is not None:
            return SiteDecision(queue[0], "queue_remote", queue[1])
        pick = self._draw([(n, r) for n, r in far if views[n].permits_free > 0], views) or self._queue(far, views)
        if pick is not None:
            return SiteDecision(pick[0], "far", pick[1])
        return SiteDecision(None, "rejected", 0.0)

    def _queue(self, sites: list[tuple[str, float]], views: dict[str, SiteView]) -> tuple[str, float] | None:
        """Of ``sites``, the one whose queue admits a request with the least rtt + queue wait."""
        queues = [(n, r) for n, r in sites if can_queue(views[n], self.config.max_queue_wait_s)]
        return min(queues, key=lambda e: (e[1] + views[e[0]].queue_wait_s, e[0])) if queues else None

    def _draw(self, cands: list[tuple[str, float]], views: dict[str, SiteView]) -> tuple[str, float] | None:
        """A draw among ``cands`` weighted by free capacity (free permits, discounted by queue wait)."""
        if not cands:
            return None
        weights = [views[n].permits_free / (1.0 + views[n].queue_wait_s / self.config.wait_scale_s) for n, _ in cands]
        return self.rng.choices(cands, weights=weights, k=1)[0]

    def _session(self, origin: str, site: str, views: dict[str, SiteView], latency: LatencyMap,
                 now: float) -> SiteDecision | None:
        """Rule 1: the session's site if it can serve the turn, else None."""
        rtt, view = latency.rtt(origin, site, now), views.get(site)
        if site == origin:
            return SiteDecision(site, "session", 0.0) if can_queue(view, self.config.max_queue_wait_s) else None
        if rtt is None or view is None or not view.alive or view.permits_total == 0:
            return None
        freed = view.permits_free > 0 and self.backoff.heard_since(site, view.as_of)  # heard free since its refusal
        if self.backoff.active(site, now) and not freed:
            return None
        return SiteDecision(site, "session", rtt)

    def _spill(self, local: SiteView | None, near: list[tuple[str, float]],
               views: dict[str, SiteView]) -> tuple[str, float] | None:
        """Rules 2-3: None to keep the request (or when nowhere is worth the trip), else a
        capacity-weighted draw among the near sites worth it."""
        cfg = self.config
        cands = [(n, r) for n, r in near if views[n].permits_free > 0]
        if local is not None and local.permits_free > 0:
            if local.load <= cfg.spill_point(local.permits_total):
                return None
            # Hot only against a cooler neighbour: one at least balance_margin less loaded.
            cands = [(n, r) for n, r in cands if views[n].load <= local.load - cfg.balance_margin]
        elif local is not None and local.queue_wait_s <= cfg.max_queue_wait_s:
            # Full, but the local queue would admit it: go only where the trip beats the wait.
            cands = [(n, r) for n, r in cands
                     if r + views[n].queue_wait_s + cfg.forward_overhead_s < local.queue_wait_s]
        return self._draw(cands, views)
