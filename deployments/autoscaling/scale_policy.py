"""Forecast-based replica counts per pool, with guard rails; the same objects run inside
Serve's autoscaling (deployments/autoscaling/autoscaling.py) and in the simulator (bench/autoscale/autoscale_sim.py).

Each decision gets the pool's `Signals` (what the replicas report, time passed in)
and the replica count Serve is steering to, and returns the count it wants:

1. Forecast. One forecaster (deployments/autoscaling/forecast.py) follows the interactive
   request arrival rate, from the replicas' cumulative counters (`RateMeter`:
   fresh, non-overlapping intervals) or else from a reported rate. A replica
   asked for now serves only after the horizon
   H = engine start + Serve's upscale delay + the signal's age + one bin,
   so the pool is sized for the largest forecast over [now, now + H] (an upper
   quantile: mean + `z` standard errors where the model gives them).
2. Capacity. The rate becomes load in the pool's unit: uncached prompt tokens
   (prompt x (1 - prefix hit rate)) for prefill and colocated, output tokens for
   decode. Each replica is planned at `utilization` of its throughput at the
   pool's target batch: the largest batch whose per-request service of the
   mean request takes at most `service_fraction` of the TTFT SLO, the rest
   left for queueing (deployments/autoscaling/capacity.py; re-planned as the reported
   lengths change). With no curve, or no arrival signal, the policy forecasts
   the in-flight count instead and divides by `target_ongoing_requests`.
3. Now. The load of this moment also counts: the recent rate plus the backlog
   (requests beyond what the running replicas batch) drained within `drain_s`;
   and when the fronts' admission wait exceeds the SLO's queueing share, one
   replica more than now.
   A pool short of replicas by that, or by the mean forecast (not only by its
   margin), is short urgently. A scale-down never goes below what the mean
   forecast needs one scale-down delay after the horizon (`Need.hold`).
4. Deferrable work. Batch requests the Batch API holds (`deferrable_tokens`) wait
   for spare capacity: `spare_tokens_per_s` says how much the running replicas
   can take now without touching the interactive plan. Batch work adds replicas
   only where that spare cannot finish it by its deadline; and while it waits,
   replicas it could fill are not let go, so it runs in the troughs after a peak
   rather than on replicas started for it at the peak.
5. Guard rails (`GuardRails`): min/max replicas; a scale-down only after the
   need stayed below the current count for `downscale_delay_s`, and then to the
   largest need seen in that time; at most one direction change per `cooldown_s`
   (an urgent scale-up may still reverse a recent scale-down).

`AppPolicy` couples the prefill and decode pools (Serve's application-level
policy): one arrival forecast sizes both, both decide on the same tick, and a
pool that wants to shrink holds while the other grows, so they move together.
`ReactivePolicy` is today's in-flight policy, for comparisons.
Pure logic: plain classes, no clock, no Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from deployments.autoscaling.capacity import PoolCurve, replicas_for
from deployments.autoscaling.forecast import Forecaster, make_forecaster


@dataclass(frozen=True)
class Signals:
    """One pool's signals at time `t` (seconds); None: not reported."""

    t: float
    ongoing: float = 0.0  # requests in flight, all replicas
    arrivals: dict[str, tuple[float, float]] | None = None  # replica -> (recorded at, interactive requests so far)
    arrival_rps: float | None = None  # requests arriving per second, when no counters are reported
    prompt_tokens: float | None = None  # mean prompt tokens per request
    prefix_hit: float | None = None  # fraction of prompt tokens served from cache
    output_tokens: float | None = None  # mean output tokens per request
    queue_wait_s: float | None = None  # mean admission wait of recent requests
    permits_in_use: float | None = None
    running: int | None = None  # replicas serving now (None: the target count)
    deferrable_tokens: float = 0.0  # batch work held back, in the pool's unit
    deferrable_due_s: float | None = None  # seconds until the oldest deferred work is due


@dataclass(frozen=True)
class PolicyParams:
    """Settings of one pool's policy; bounds and delays as in Serve's autoscaling_config."""

    min_replicas: int = 1
    max_replicas: int = 4
    target_ongoing_requests: float = 8.0  # fallback sizing without a curve
    engine_start_s: float = 60.0
    upscale_delay_s: float = 0.0  # Serve's delay around this policy (added to the horizon)
    signal_lag_s: float = 5.0  # age of the arrival signal: half Serve's metric push interval
    downscale_delay_s: float = 300.0
    cooldown_s: float = 600.0
    forecaster: str = "kalman"
    step_s: float = 5.0
    window: int = 120
    refit_s: float = 300.0
    z: float = 1.0
    slo_ttft_s: float = 2.0
    service_fraction: float = 0.5  # of the SLO a request's own service may take at the target batch
    utilization: float = 0.8  # of the target batch's throughput a replica is planned at
    drain_s: float = 30.0
    prompt_tokens: float = 400.0  # defaults until the replicas report lengths
    output_tokens: float = 64.0

    def horizon_s(self) -> float:
        return self.engine_start_s + self.upscale_delay_s + self.signal_lag_s + self.step_s


class RateMeter:
    """Arrival rate from per-replica cumulative counters, between two snapshots."""

    def __init__(self) -> None:
        self.prev: dict[str, tuple[float, float]] = {}

    def rate(self, counters: dict[str, tuple[float, float]]) -> float | None:
        """Requests/s since the previous snapshot, None until the counters move on in time;
        keeps `counters` as the next baseline. A replica seen for the first time counts
        from its previous value of zero only if it is younger than the interval."""
        if not self.prev:
            self.prev = dict(counters)
            return None
        t_now = max((t for t, _ in counters.values()), default=0.0)
        t_prev = max((t for t, _ in self.prev.values()), default=0.0)
        if t_now <= t_prev:
            return None
        new = 0.0
        for replica, (_, count) in counters.items():
            before = self.prev.get(replica)
            new += max(0.0, count - before[1]) if before else 0.0
        self.prev = dict(counters)
        return new / (t_now - t_prev)


class GuardRails:
    """Bounds, scale-down delay and one direction change per cool-down; keeps its history."""

    def __init__(self, min_replicas: int, max_replicas: int, downscale_delay_s: float, cooldown_s: float) -> None:
        self.lo, self.hi = min_replicas, max_replicas
        self.downscale_delay_s, self.cooldown_s = downscale_delay_s, cooldown_s
        self.last_dir = 0  # +1 up, -1 down, 0 none yet
        self.reversed_at = -math.inf  # time of the latest direction change
        self._below_since: float | None = None
        self._below_peak = 0

    def clamp(self, n: int) -> int:
        return max(self.lo, min(self.hi, n))

    def apply(self, t: float, current: int, desired: int, urgent: bool = False) -> int:
        """The count to steer to, given `desired`; records a move, the delay and reversals.
        `urgent`: the pool is short of replicas by more than a forecast margin, so a
        scale-up may reverse a recent scale-down."""
        desired = self.clamp(desired)
        if desired >= current:
            self._below_since = None
            if desired == current or not self._may_move(t, +1, urgent):
                return current
            return self._moved(t, +1, desired)
        if self._below_since is None:
            self._below_since, self._below_peak = t, desired
        self._below_peak = max(self._below_peak, desired)
        if t - self._below_since < self.downscale_delay_s or not self._may_move(t, -1, False):
            return current
        target = self._below_peak
        self._below_since = None
        return self._moved(t, -1, target) if target < current else current

    def _may_move(self, t: float, direction: int, urgent: bool) -> bool:
        reversing = self.last_dir not in (0, direction)
        return not reversing or urgent or t - self.reversed_at >= self.cooldown_s

    def _moved(self, t: float, direction: int, target: int) -> int:
        if self.last_dir not in (0, direction):
            self.reversed_at = t
        self.last_dir = direction
        return target


@dataclass
class Need:
    """What one pool needs: `now` (this moment), `ahead` (over the horizon), `urgent`."""

    now: int
    ahead: int
    urgent: bool
    detail: dict = field(default_factory=dict)
    hold: int = 0  # what the mean forecast needs after the scale-down delay: no scale-down below it

    def wish(self, current: int) -> int:
        """The count to ask for: the larger need; a shrink never below `hold`."""
        want = max(self.now, self.ahead)
        return max(want, min(self.hold, current)) if want < current else want


class PoolSizer:
    """Turns a request rate into replicas of one pool from its capacity curve."""

    def __init__(self, pool: str, curve: PoolCurve, params: PolicyParams) -> None:
        self.pool, self.curve, self.p = pool, curve, params
        self.unit = "output_tokens" if pool == "decode" else "prompt_tokens"
        # Decode's SLO is per token, so its batch is the curve's largest; prefill leaves part of the TTFT SLO.
        self.budget = math.inf if pool == "decode" else params.slo_ttft_s * params.service_fraction
        self.peak_per_replica = curve.tokens_per_s(curve.max_batch()) if not curve.empty() else 0.0
        self.work = -1.0
        self.set_work(params.output_tokens if pool == "decode" else params.prompt_tokens)

    def set_work(self, tokens: float) -> None:
        """Plans the target batch and per-replica rate for requests of `tokens` (to 10 tokens)."""
        work = max(10.0, round(tokens, -1))
        if work == self.work:
            return
        self.work = work
        self.batch = self.curve.target_batch(work, self.budget) if not self.curve.empty() else 0
        self.per_replica = self.curve.tokens_per_s(self.batch) * self.p.utilization if self.batch else 0.0

    def usable(self) -> bool:
        return self.per_replica > 0

    def tokens_per_request(self, s: Signals) -> float:
        if self.pool == "decode":
            return s.output_tokens if s.output_tokens is not None else self.p.output_tokens
        prompt = s.prompt_tokens if s.prompt_tokens is not None else self.p.prompt_tokens
        return prompt * (1.0 - min(max(s.prefix_hit or 0.0, 0.0), 1.0))

    def replicas(self, load_tps: float) -> int:
        return replicas_for(load_tps, self.per_replica)

    def backlog(self, s: Signals, current: int) -> float:
        """Requests in flight beyond what the running replicas batch."""
        running = current if s.running is None else s.running
        return max(0.0, s.ongoing - running * max(1, self.curve.max_batch()))


class ForecastPolicy:
    """One pool's forecast policy; `decide` is the whole per-tick call."""

    def __init__(self, pool: str, curve: PoolCurve, params: PolicyParams,
                 forecaster: Forecaster | None = None) -> None:
        self.p = params
        self.sizer = PoolSizer(pool, curve, params)
        self.forecaster = forecaster or make_forecaster(params.forecaster, params.step_s, params.window,
                                                        params.refit_s)
        self.rails = GuardRails(params.min_replicas, params.max_replicas, params.downscale_delay_s,
                                params.cooldown_s)
        self.last: Need | None = None
        self.meter = RateMeter()

    def observe(self, s: Signals) -> None:
        """Feeds the forecaster: the arrival rate (from the counters, else the reported
        rate), or the in-flight count without a curve or any arrival signal."""
        if not self._by_rate(s):
            self.forecaster.observe(s.t, s.ongoing)
        elif s.arrivals is not None:
            rate = self.meter.rate(s.arrivals)
            if rate is not None:
                self.forecaster.observe(s.t, rate)
        else:
            self.forecaster.observe(s.t, s.arrival_rps)

    def _by_rate(self, s: Signals) -> bool:
        return self.sizer.usable() and (s.arrivals is not None or s.arrival_rps is not None)

    def need(self, s: Signals, current: int) -> Need:
        """What the pool needs now and over the horizon; changes only the sizer's plan
        for the reported request size."""
        h, z = self.p.horizon_s(), self.p.z
        peak = max(self.forecaster.predict(h * i / 3, z) for i in range(1, 4))
        if not self._by_rate(s):
            per = self.p.target_ongoing_requests
            now = math.ceil(s.ongoing / per - 1e-9)
            ahead = math.ceil(peak / per - 1e-9)
            later = math.ceil(self.forecaster.predict(h + self.p.downscale_delay_s) / per - 1e-9)
            mean = math.ceil(self.forecaster.predict(h) / per - 1e-9)
            return Need(now, ahead, max(now, mean) > current, {"ongoing": s.ongoing, "forecast": peak}, later)
        tpr = self.sizer.tokens_per_request(s)
        self.sizer.set_work(tpr)
        backlog_tps = self.sizer.backlog(s, current) * tpr / self.p.drain_s
        now_tps = self.forecaster.recent() * tpr + backlog_tps
        # Deferred batch work adds replicas only where the spare capacity cannot meet its deadline.
        batch_tps = max(0.0, deferred_rate(s, h) - self.spare_tokens_per_s(s, current))
        mean = max(self.forecaster.predict(h * i / 3) for i in range(1, 4))
        ahead_tps = max(peak * tpr, now_tps) + batch_tps
        later = self.forecaster.predict(h + self.p.downscale_delay_s) * tpr + batch_tps
        # While batch work waits, replicas it could fill are kept: the troughs run it.
        later += s.deferrable_tokens / (h + self.p.downscale_delay_s)
        need = Need(self.sizer.replicas(now_tps), self.sizer.replicas(ahead_tps), False,
                    {"rate": s.arrival_rps, "forecast_rps": peak, "tokens_per_request": tpr,
                     "load_tps": now_tps, "planned_tps": ahead_tps})
        if s.queue_wait_s is not None and s.queue_wait_s > self.p.slo_ttft_s * (1 - self.p.service_fraction):
            need.now = max(need.now, current + 1)  # requests wait for permits beyond the queueing budget
        # Urgent: short of replicas now, or by the mean forecast (not only by its margin).
        need.urgent = max(need.now, self.sizer.replicas(mean * tpr + batch_tps)) > current
        need.hold = self.sizer.replicas(later)
        return need

    def desired(self, s: Signals, current: int) -> int:
        """Observes `s` and returns the pool's wish before the guard rails."""
        self.observe(s)
        self.last = self.need(s, current)
        return self.last.wish(current)

    def decide(self, s: Signals, current: int) -> int:
        """Observes `s`, updates the guard rails' history and returns the count to steer to."""
        wish = self.desired(s, current)
        return self.rails.apply(s.t, current, wish, self.last.urgent)

    def spare_tokens_per_s(self, s: Signals, current: int) -> float:
        """Batch work (the pool's unit per second) the running replicas can take now on top
        of the interactive load, at their planned batch; changes nothing."""
        running = current if s.running is None else s.running
        interactive = self.forecaster.recent() * self.sizer.tokens_per_request(s)
        return max(0.0, running * self.sizer.per_replica - interactive)


def deferred_rate(s: Signals, horizon_s: float) -> float:
    """The rate at which deferred batch work must run to be done when due (0 without any)."""
    if s.deferrable_tokens <= 0:
        return 0.0
    due = s.deferrable_due_s if s.deferrable_due_s is not None else math.inf
    return s.deferrable_tokens / max(due - horizon_s, horizon_s)


class AppPolicy:
    """Prefill and decode from one forecast, deciding together (Serve's app-level policy).

    `pools` maps each pool to its ForecastPolicy; `lead` names the pool whose
    signals carry the arrival rate and lengths (decode: its fronts admit every
    request). Both pools share the lead's forecaster."""

    def __init__(self, pools: dict[str, ForecastPolicy], lead: str = "decode") -> None:
        self.pools, self.lead = pools, lead
        shared = pools[lead].forecaster
        for policy in pools.values():
            policy.forecaster = shared

    def decide(self, signals: dict[str, Signals], current: dict[str, int]) -> dict[str, int]:
        """Each pool's count to steer to; observes the lead's signals once per call."""
        lead = signals[self.lead]
        self.pools[self.lead].observe(lead)
        wishes = {}
        lead = replace(lead, arrival_rps=self.pools[self.lead].forecaster.recent())
        for name, policy in self.pools.items():
            s = _with_rates(signals[name], lead)
            policy.last = policy.need(s, current[name])
            wishes[name] = policy.last.wish(current[name])
        growing = any(w > current[n] for n, w in wishes.items())
        out = {}
        for name, policy in self.pools.items():
            wish = max(wishes[name], current[name]) if growing else wishes[name]
            out[name] = policy.rails.apply(signals[name].t, current[name], wish, policy.last.urgent)
        return out


def _with_rates(s: Signals, lead: Signals) -> Signals:
    """`s` with the lead pool's rate and lengths (the pools share its forecast)."""
    return replace(s, arrivals=None, arrival_rps=lead.arrival_rps,
                   prompt_tokens=s.prompt_tokens if s.prompt_tokens is not None else lead.prompt_tokens,
                   prefix_hit=s.prefix_hit if s.prefix_hit is not None else lead.prefix_hit,
                   output_tokens=s.output_tokens if s.output_tokens is not None else lead.output_tokens)


class ReactivePolicy:
    """Today's policy (deployments/autoscaling.in_flight_policy): in-flight / target."""

    def __init__(self, target_ongoing_requests: float) -> None:
        self.target = target_ongoing_requests

    def desired(self, s: Signals, current: int) -> float:
        """Changes nothing; Serve applies bounds and delays around it."""
        return s.ongoing / self.target
