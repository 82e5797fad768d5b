"""Discrete-event simulator of many Baton sites, driving the real site policies.

Sites are real cities (bench/sites/sites_geo.py): RTT from great-circle distance,
load from the local time of day. The run is ``duration_s`` seconds of
wall-clock starting when it is ``hotspot_local_hour`` at the hotspot; the
first ``warmup_s`` are not measured.

Workload (drawn once from the seed, identical for every policy):
  - sessions arrive at each site as a Poisson process of rate
    peak_util * permits / service_s * diurnal(local hour) / turns_mean
    (x ``hotspot_factor`` at the hotspot), so at its daily peak an ordinary
    site is ``peak_util`` busy: sites provisioned at twice their peak;
  - a session has a geometric number of turns (mean ``turns_mean``); each
    turn needs one permit for an exponential service time (mean
    ``service_s``); the next turn arrives an exponential think time (mean
    ``think_s``) after the previous one ended (or was rejected).
Sites: ``permits`` from the city table; a request arriving at a site takes a
free permit, else joins its FIFO queue when the expected wait
(queued + 1) * service_s / permits is within ``max_queue_wait_s``, else is
refused; a session's turn at the site that served its previous turn may
take ``turn_queue_places`` places more (``sites.turn_queue_places``). A
refused forward is reported to the policy (``refused``) and the origin
chooses again, up to the policy's ``max_attempts`` choices; then it is
rejected.
What the policy sees: its own site fresh, every other site as gossiped
every ``view_period_s`` (stale in between), each with ``busy_avg``, the
EWMA of its busy fraction with time constant ``load_tau_s`` (about a
session's life: 3 turns of 4 s and two 20 s pauses), and a LatencyMap filled by
many-to-many probes every ``probe_period_s`` (true RTT + up to
``probe_jitter`` noise) that expire after ``probe_ttl_s``. With an
``outage`` (site, start, end) the site admits nothing, stops probing and
answering probes and gossiping (its last view stays, marked dead after
``view_ttl_s``), and its own arrivals go to its nearest live site (anycast).
The propagation delay is not added to service times; it is reported as
added RTT.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass

from bench.sites.sites_geo import City, diurnal, pick, rtt_s
from bench.sites.sites_metrics import Recorder
from routing.sites.latency_map import LatencyMap
from routing.sites.site_policies import SITE_POLICIES, make_selector
from routing.sites.site_select import SiteSelectConfig, SiteView

POLICIES = SITE_POLICIES
_TURN, _DONE, _GOSSIP, _PROBE, _DOWN, _UP = range(6)


@dataclass(frozen=True)
class SimConfig:
    sites: int = 70
    hotspot: str = "Frankfurt"
    hotspot_factor: float = 5.0
    hotspot_local_hour: float = 14.0
    duration_s: float = 1200.0
    warmup_s: float = 300.0
    peak_util: float = 0.5
    service_s: float = 4.0
    turns_mean: float = 3.0
    think_s: float = 20.0
    view_period_s: float = 1.0
    view_ttl_s: float = 10.0
    load_tau_s: float = 60.0
    probe_period_s: float = 10.0
    probe_ttl_s: float = 30.0
    probe_jitter: float = 0.1
    outage: tuple[str, float, float] | None = None
    seed: int = 0
    turn_queue_places: int = 1

    def __post_init__(self) -> None:
        if self.hotspot_factor < 1 or self.peak_util <= 0 or self.service_s <= 0 or self.turns_mean < 1:
            raise ValueError("need hotspot_factor >= 1, peak_util > 0, service_s > 0, turns_mean >= 1")
        if not 0 <= self.warmup_s < self.duration_s:
            raise ValueError("need 0 <= warmup_s < duration_s")
        if self.view_period_s <= 0 or self.probe_period_s <= 0:
            raise ValueError("need positive periods")


@dataclass
class Session:
    origin: int
    start: float
    services: list[float]  # one per turn
    thinks: list[float]  # the pause before turns 2..n


def workload(cities: list[City], cfg: SimConfig) -> list[Session]:
    """Every session of the run, from ``cfg.seed`` alone (same for every policy)."""
    rng = random.Random(cfg.seed)
    start_utc = cfg.hotspot_local_hour - next(c.utc_offset_h for c in cities if c.name == cfg.hotspot)
    out = []
    for i, c in enumerate(cities):
        factor = cfg.hotspot_factor if c.name == cfg.hotspot else 1.0
        peak = cfg.peak_util * c.permits / cfg.service_s / cfg.turns_mean * factor
        t = 0.0
        while True:
            t += rng.expovariate(peak)
            if t >= cfg.duration_s:
                break
            if rng.random() < diurnal(start_utc + c.utc_offset_h + t / 3600.0):  # thinning
                turns = 1
                while rng.random() > 1.0 / cfg.turns_mean:
                    turns += 1
                out.append(Session(i, t, [rng.expovariate(1 / cfg.service_s) for _ in range(turns)],
                                   [rng.expovariate(1 / cfg.think_s) for _ in range(turns - 1)]))
    return out


class _Site:
    def __init__(self, city: City, tau_s: float) -> None:
        self.city = city
        self.busy = 0
        self.queue: deque = deque()
        self.alive = True
        self.tau_s = tau_s
        self.avg = 0.0  # EWMA of the busy fraction, time constant tau_s
        self._as_of = 0.0

    def add(self, t: float, delta: int) -> None:
        """Busy permits change by ``delta`` at ``t``; the average takes in the time before."""
        self.avg_at(t)
        self.busy += delta

    def avg_at(self, t: float) -> float:
        keep = math.exp(-(t - self._as_of) / self.tau_s)
        self.avg = keep * self.avg + (1 - keep) * self.busy / self.city.permits
        self._as_of = t
        return self.avg

    def wait_s(self, service_s: float) -> float:
        """Expected wait of a request admitted now: 0 with a free permit."""
        if self.busy < self.city.permits:
            return 0.0
        return (len(self.queue) + 1) * service_s / self.city.permits

    def view(self, t: float, service_s: float, extra_places: int = 0) -> SiteView:
        """What a probe reads now; ``extra_places``: as a turn that may queue that many places beyond
        the bound finds it (the wait it is judged by, ``wait_s`` less those places)."""
        wait = max(0.0, self.wait_s(service_s) - extra_places * service_s / self.city.permits)
        return SiteView(self.city.name, self.city.permits - self.busy, self.city.permits,
                        wait, self.alive, min(1.0, self.avg_at(t)), as_of=t)


class SiteSim:
    """One policy over one workload. ``run`` returns the metrics (bench/sites/sites_metrics.py)."""

    def __init__(self, cfg: SimConfig, policy_name: str, select: SiteSelectConfig | None = None) -> None:
        self.cfg = cfg
        self.select = select or SiteSelectConfig()
        self.cities = pick(cfg.sites, cfg.hotspot)
        self.sites = [_Site(c, cfg.load_tau_s) for c in self.cities]
        self.index = {c.name: i for i, c in enumerate(self.cities)}
        self.policy = make_selector(policy_name, self.select, random.Random(cfg.seed))
        self.latency = LatencyMap(cfg.probe_ttl_s)
        self.views: dict[str, SiteView] = {}
        self.heard: dict[str, float] = {}
        self.probe_rng = random.Random(cfg.seed + 1)
        self.sessions = workload(self.cities, cfg)
        self.session_site: list[str | None] = [None] * len(self.sessions)
        self.rec = Recorder(self.cities, cfg.warmup_s, cfg.hotspot)
        self._heap: list = []
        self._seq = 0

    def _push(self, t: float, kind: int, data) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, data))

    def run(self) -> dict:
        cfg = self.cfg
        for k, s in enumerate(self.sessions):
            self._push(s.start, _TURN, (k, 0))
        self._push(0.0, _PROBE, None)
        self._push(0.0, _GOSSIP, None)
        if cfg.outage:
            self._push(cfg.outage[1], _DOWN, self.index[cfg.outage[0]])
            self._push(cfg.outage[2], _UP, self.index[cfg.outage[0]])
        handlers = {_TURN: self._turn, _DONE: self._done, _GOSSIP: self._gossip, _PROBE: self._probe,
                    _DOWN: self._down, _UP: self._up}
        while self._heap:
            t, _, kind, data = heapq.heappop(self._heap)
            if t > cfg.duration_s:
                break
            handlers[kind](t, data)
        return self.rec.summary(cfg.duration_s)

    def _probe(self, t: float, _) -> None:
        """Every live site probes every other live site."""
        live = [s.city for s in self.sites if s.alive]
        jitter = self.cfg.probe_jitter
        for a in live:
            for b in live:
                if a is not b:
                    self.latency.observe(a.name, b.name, rtt_s(a, b) * (1 + jitter * self.probe_rng.random()), t)
        self._push(t + self.cfg.probe_period_s, _PROBE, None)

    def _gossip(self, t: float, _) -> None:
        """Live sites publish their views; a silent site's last view goes dead after view_ttl_s."""
        for s in self.sites:
            name = s.city.name
            if s.alive:
                self.views[name] = s.view(t, self.cfg.service_s)
                self.heard[name] = t
            elif name in self.views and t - self.heard[name] > self.cfg.view_ttl_s and self.views[name].alive:
                v = self.views[name]
                self.views[name] = SiteView(name, v.permits_free, v.permits_total, v.queue_wait_s, False,
                                            as_of=v.as_of)
        self._push(t + self.cfg.view_period_s, _GOSSIP, None)

    def _down(self, t: float, i: int) -> None:
        self.sites[i].alive = False

    def _up(self, t: float, i: int) -> None:
        self.sites[i].alive = True

    def _origin(self, i: int) -> int:
        """The session's site, or the nearest live one when it is down (anycast)."""
        if self.sites[i].alive:
            return i
        home = self.cities[i]
        return min((j for j, s in enumerate(self.sites) if s.alive), key=lambda j: rtt_s(home, self.cities[j]))

    def _turn(self, t: float, data: tuple[int, int]) -> None:
        k, turn = data
        origin = self._origin(self.sessions[k].origin)
        name = self.cities[origin].name
        prev = self.session_site[k]
        stale = self.views.get(name)
        places = self.cfg.turn_queue_places if prev == name else 0
        self.views[name] = self.sites[origin].view(t, self.cfg.service_s, places)  # its own site, fresh
        try:
            tried = set()
            for _ in range(self.select.max_attempts):
                d = self.policy.choose(name, self.views, self.latency, t, prev)
                if d.site is None or d.site in tried:
                    break
                tried.add(d.site)
                j = self.index[d.site]
                if self._admit(j, t, (k, turn, t), self.cfg.turn_queue_places if d.reason == "session" else 0):
                    if j != origin:
                        self.policy.served(d.site, t)
                    self.session_site[k] = d.site
                    self.rec.served(t, origin, j, d.reason, d.rtt_s, turn, prev)
                    return
                if j != origin:
                    self.policy.refused(d.site, t)
                    self.rec.refused(t)
                if j == origin:
                    break
            self.rec.rejected(t, origin, turn)
            self._next_turn(t, k, turn)
        finally:
            if stale is not None:
                self.views[name] = stale

    def _admit(self, j: int, t: float, req: tuple[int, int, float], extra_places: int = 0) -> bool:
        site = self.sites[j]
        if not site.alive:
            return False
        if site.busy < site.city.permits:
            self._start(j, t, req)
            return True
        beyond = extra_places * self.cfg.service_s / site.city.permits
        if site.wait_s(self.cfg.service_s) <= self.select.max_queue_wait_s + beyond:
            site.queue.append(req)
            return True
        return False

    def _start(self, j: int, t: float, req: tuple[int, int, float]) -> None:
        k, turn, arrived = req
        self.rec.busy(t, j, +1)
        self.sites[j].add(t, +1)
        self.rec.waited(arrived, t - arrived)
        self._push(t + self.sessions[k].services[turn], _DONE, (j, k, turn))

    def _done(self, t: float, data: tuple[int, int, int]) -> None:
        j, k, turn = data
        site = self.sites[j]
        self.rec.busy(t, j, -1)
        site.add(t, -1)
        if site.queue:
            self._start(j, t, site.queue.popleft())
        self._next_turn(t, k, turn)

    def _next_turn(self, t: float, k: int, turn: int) -> None:
        s = self.sessions[k]
        if turn + 1 < len(s.services):
            self._push(t + s.thinks[turn], _TURN, (k, turn + 1))


def simulate(cfg: SimConfig, policy: str, select: SiteSelectConfig | None = None) -> dict:
    """Runs ``policy`` over ``cfg``'s workload; the metrics of bench/sites/sites_metrics.Recorder.summary."""
    return SiteSim(cfg, policy, select).run()

