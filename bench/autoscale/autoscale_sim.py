"""Simulator of a disaggregated Baton app under autoscaling, replaying a rate trace
through the same policy objects Serve runs (deployments/autoscaling/scale_policy.py).

Time is passed in: the loop advances `dt_s` at a time, no clock, no Ray.

Requests (drawn once from the seed, identical for every policy): Poisson
arrivals at the trace's rate; prompt and output lengths gamma-distributed
around their means (coefficient of variation 0.25); a prefix hit fraction
per request (beta, mean `prefix_hit`), so a request's prefill work is
prompt x (1 - hit) tokens. Batch jobs of the trace arrive whole at their
submission time.

Pools: prefill, then decode. A replica runs up to its curve's largest batch
at once; each of its `b` requests advances at tokens_per_s(b) / b (the
capacity curve, deployments/autoscaling/capacity.py), so batching raises throughput and
slows each request, as continuous batching does. Queued requests go to the
ready replica running the fewest (interactive before batch). A replica asked
for serves after `engine_start_s`; a replica let go takes no new work and
leaves when its requests finish (starting ones are let go first). Every
replica counts in replica-seconds from its start request until it leaves.
TTFT = arrival to the end of prefill (the first token comes from prefill);
a request misses the SLO when that exceeds `slo_ttft_s`.

What policies see, as Serve would give it them: per pool, the in-flight
count averaged over `look_back_s`; from the fronts (decode), the counter of
interactive arrivals as last pushed (every `push_s`, with its timestamp, as
in `ctx.raw_metrics`) and the mean lengths and hit rate of the arrivals
within the look-back; the ready replica count; deferred batch work in each
pool's unit and the time until the oldest is due. The reactive policy is
given the operating point of the forecast policy: its target in flight per
replica is the prefill (decode) pool's planned batch x `utilization`, so the
two differ only in when they move. Decisions every
`tick_s`, then Serve's own wrapper (`ServeDelays`: ceil, up/down delays,
bounds). Policies (`POLICIES`): `reactive` is today's in-flight policy with
Serve's default delays (30 s up, 600 s down), batch work sent at once with
`batch_concurrency` in flight; `constant`, `holt` and `forecast` (Kalman) are
the app-level forecast policy with those forecasters, Serve's delays off
(their own guard rails apply) and batch work held until spare capacity or
its deadline needs it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from bench.autoscale.autoscale_traces import Trace
from deployments.autoscaling.capacity import CapacityFile
from deployments.autoscaling.scale_policy import AppPolicy, ForecastPolicy, PolicyParams, ReactivePolicy, Signals

POLICIES = ("reactive", "constant", "holt", "forecast")
FORECASTER = {"constant": "constant", "holt": "holt", "forecast": "kalman"}
POOLS = ("prefill", "decode")


@dataclass(frozen=True)
class SimConfig:
    dt_s: float = 0.2
    tick_s: float = 1.0
    seed: int = 0
    slo_ttft_s: float = 1.5
    engine_start_s: float = 60.0
    min_replicas: int = 1
    max_replicas: int = 10
    prompt_tokens: float = 400.0
    output_tokens: float = 64.0
    prefix_hit: float = 0.25
    length_shape: float = 16.0  # gamma shape of the lengths: coefficient of variation 1/sqrt(shape)
    warmup_s: float = 300.0  # not measured: pools start at min_replicas
    look_back_s: float = 30.0
    push_s: float = 10.0  # replicas push their metrics to Serve this often
    utilization: float = 0.8
    service_fraction: float = 0.5
    serve_upscale_delay_s: float = 30.0
    serve_downscale_delay_s: float = 600.0
    downscale_delay_s: float = 120.0
    cooldown_s: float = 600.0
    z: float = 1.0
    batch_concurrency: int = 32
    sample_s: float = 10.0


class ServeDelays:
    """Serve's wrapper around a custom policy (ray.serve.autoscaling_policy): ceil,
    upscale/downscale delays measured from the first consecutive wish, bounds."""

    def __init__(self, lo: int, hi: int, up_s: float, down_s: float) -> None:
        self.lo, self.hi, self.up_s, self.down_s = lo, hi, up_s, down_s
        self.direction, self.since = 0, None

    def apply(self, t: float, desired: float, target: int) -> int:
        """The new target from the policy's `desired`; keeps the delay state."""
        want = max(self.lo, min(self.hi, math.ceil(desired - 1e-9)))
        if want == target:
            self.direction, self.since = 0, None
            return target
        direction = 1 if want > target else -1
        if direction != self.direction:
            self.direction, self.since = direction, t
        if t - self.since + 1e-6 >= (self.up_s if direction > 0 else self.down_s):
            self.direction, self.since = 0, None
            return want
        return target


class Replica:
    __slots__ = ("ready_at", "stopping", "active")

    def __init__(self, ready_at: float) -> None:
        self.ready_at, self.stopping, self.active = ready_at, False, []  # active: [rid, remaining]


class Pool:
    """One pool's replicas and queues; `step` serves `dt` seconds."""

    def __init__(self, curve, start_s: float, initial: int) -> None:
        self.curve, self.start_s = curve, start_s
        self.max_batch = max(1, curve.max_batch())
        self.replicas = [Replica(0.0) for _ in range(initial)]
        self.queues = (deque(), deque())  # interactive, batch
        self.target = initial

    def set_target(self, t: float, n: int) -> None:
        """Starts or lets go replicas so that `n` are wanted (starting ones go first)."""
        live = [r for r in self.replicas if not r.stopping]
        self.target = n
        if n > len(live):
            self.replicas += [Replica(t + self.start_s) for _ in range(n - len(live))]
            return
        for r in sorted(live, key=lambda r: (r.ready_at <= t, len(r.active)))[:len(live) - n]:
            r.stopping = True
        self.replicas = [r for r in self.replicas if not (r.stopping and not r.active)]

    def in_flight(self) -> int:
        return len(self.queues[0]) + len(self.queues[1]) + sum(len(r.active) for r in self.replicas)

    def ready(self, t: float) -> int:
        return sum(1 for r in self.replicas if r.ready_at <= t and not r.stopping)

    def step(self, t: float, dt: float, work: np.ndarray, done: list) -> None:
        """Dispatches queued requests, advances the running ones by `dt`; appends
        (rid, finish time) of each finished request to `done`."""
        open_ = [r for r in self.replicas if r.ready_at <= t and not r.stopping]
        for q in self.queues:
            while q and open_:
                r = min(open_, key=lambda r: len(r.active))
                if len(r.active) >= self.max_batch:
                    break
                rid = q.popleft()
                r.active.append([rid, work[rid]])
        for r in self.replicas:
            b = len(r.active)
            if not b:
                continue
            rate = self.curve.tokens_per_s(b) / b
            keep = []
            for a in r.active:
                a[1] -= rate * dt
                if a[1] <= 0:
                    done.append((a[0], t + dt + a[1] / rate))
                else:
                    keep.append(a)
            r.active = keep
        self.replicas = [r for r in self.replicas if not (r.stopping and not r.active)]


def draw_requests(trace: Trace, cfg: SimConfig) -> dict[str, np.ndarray]:
    """The workload: arrival times, prefill and decode work, batch flag and due time."""
    rng = np.random.default_rng(cfg.seed)
    edges = np.arange(0.0, trace.duration_s, cfg.dt_s)
    counts = rng.poisson([trace.rate(t) * cfg.dt_s for t in edges])
    arrive = np.repeat(edges, counts) + rng.uniform(0, cfg.dt_s, counts.sum())
    due = np.full(len(arrive), np.inf)
    batch = np.zeros(len(arrive), dtype=bool)
    for at, n, due_after in trace.batch_jobs:
        arrive = np.append(arrive, np.full(n, at))
        due = np.append(due, np.full(n, at + due_after))
        batch = np.append(batch, np.ones(n, dtype=bool))
    order = np.argsort(arrive, kind="stable")
    arrive, due, batch = arrive[order], due[order], batch[order]
    n = len(arrive)
    k = cfg.length_shape
    prompt = rng.gamma(k, cfg.prompt_tokens / k, n)
    output = np.maximum(1.0, rng.gamma(k, cfg.output_tokens / k, n))
    a = 8.0
    hit = rng.beta(a, a * (1 - cfg.prefix_hit) / cfg.prefix_hit, n) if cfg.prefix_hit > 0 else np.zeros(n)
    return {"arrive": arrive, "prompt": prompt, "hit": hit, "prefill": prompt * (1 - hit),
            "output": output, "batch": batch, "due": due}


def pool_params(cfg: SimConfig, curves: CapacityFile, policy: str) -> PolicyParams:
    """The forecast policy's settings in this simulation."""
    return PolicyParams(min_replicas=cfg.min_replicas, max_replicas=cfg.max_replicas,
                        engine_start_s=cfg.engine_start_s, signal_lag_s=cfg.push_s / 2,
                        downscale_delay_s=cfg.downscale_delay_s, cooldown_s=cfg.cooldown_s,
                        forecaster=FORECASTER.get(policy, "kalman"), z=cfg.z, slo_ttft_s=cfg.slo_ttft_s,
                        utilization=cfg.utilization, service_fraction=cfg.service_fraction,
                        prompt_tokens=cfg.prompt_tokens,
                        output_tokens=cfg.output_tokens)


def reactive_targets(cfg: SimConfig, curves: CapacityFile) -> dict[str, float]:
    """Per-pool target_ongoing_requests giving reactive the forecast policy's operating point."""
    out = {}
    for name in POOLS:
        policy = ForecastPolicy(name, curves.curve(name), pool_params(cfg, curves, "constant"))
        policy.sizer.set_work(cfg.output_tokens if name == "decode" else cfg.prompt_tokens * (1 - cfg.prefix_hit))
        out[name] = max(1.0, policy.sizer.batch * cfg.utilization)
    return out


class ReactiveController:
    """Today's policy per pool, inside Serve's default delays; batch work is not deferred."""

    defers = False

    def __init__(self, cfg: SimConfig, curves: CapacityFile) -> None:
        self.policies = {n: ReactivePolicy(t) for n, t in reactive_targets(cfg, curves).items()}
        self.serve = {n: ServeDelays(cfg.min_replicas, cfg.max_replicas, cfg.serve_upscale_delay_s,
                                     cfg.serve_downscale_delay_s) for n in POOLS}

    def decide(self, t: float, signals: dict[str, Signals], pools: dict[str, Pool]) -> dict[str, int]:
        out = {}
        for n, pool in pools.items():
            running = signals[n].running or 0
            desired = pool.target if running == 0 else self.policies[n].desired(signals[n], running)
            out[n] = self.serve[n].apply(t, desired, pool.target)
        return out


class ForecastController:
    """The app-level forecast policy (prefill and decode together), Serve's delays off."""

    defers = True

    def __init__(self, cfg: SimConfig, curves: CapacityFile, policy: str) -> None:
        params = pool_params(cfg, curves, policy)
        self.app = AppPolicy({n: ForecastPolicy(n, curves.curve(n), params) for n in POOLS}, lead="decode")
        self.horizon_s = params.horizon_s()
        self.serve = {n: ServeDelays(cfg.min_replicas, cfg.max_replicas, 0.0, 0.0) for n in POOLS}

    def decide(self, t: float, signals: dict[str, Signals], pools: dict[str, Pool]) -> dict[str, int]:
        counts = self.app.decide(signals, {n: p.target for n, p in pools.items()})
        return {n: self.serve[n].apply(t, counts[n], pools[n].target) for n in pools}

    def batch_rps(self, signals: dict[str, Signals], pools: dict[str, Pool]) -> float:
        """Batch requests per second the pools can take now beyond the interactive plan."""
        rates = []
        for n, policy in self.app.pools.items():
            s = signals[n]
            spare = policy.spare_tokens_per_s(s, pools[n].target)
            rates.append(spare / max(1.0, policy.sizer.tokens_per_request(s)))
        return min(rates)


def make_controller(policy: str, cfg: SimConfig, curves: CapacityFile):
    if policy == "reactive":
        return ReactiveController(cfg, curves)
    if policy in FORECASTER:
        return ForecastController(cfg, curves, policy)
    raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")


class Simulation:
    """One trace under one policy; `run` returns the recorder's state."""

    def __init__(self, trace: Trace, cfg: SimConfig, curves: CapacityFile, policy: str) -> None:
        from bench.autoscale.autoscale_metrics import Recorder

        self.trace, self.cfg, self.policy = trace, cfg, policy
        self.req = draw_requests(trace, cfg)
        self.pools = {n: Pool(curves.curve(n), cfg.engine_start_s, cfg.min_replicas) for n in POOLS}
        self.ctl = make_controller(policy, cfg, curves)
        n = len(self.req["arrive"])
        self.first_token = np.full(n, np.nan)
        self.finished = np.full(n, np.nan)
        self.held: deque[int] = deque()  # batch requests not yet sent to the pools
        self.batch_in_flight = 0
        self.window: deque[int] = deque()  # interactive arrivals within the look-back
        self.ongoing = {p: deque() for p in POOLS}  # (t, in flight) within the look-back
        self.rec = Recorder(cfg, POOLS)
        self.arrived = 0  # interactive arrivals so far (the fronts' counter)
        self.pushed = (0.0, 0.0)  # what Serve last received of it: (recorded at, count)
        self._credit = 0.0

    def _arrive(self, t: float, upto: float, nxt: int) -> int:
        arrive, batch = self.req["arrive"], self.req["batch"]
        while nxt < len(arrive) and arrive[nxt] < upto:
            if batch[nxt]:
                self.held.append(nxt)
            else:
                self.pools["prefill"].queues[0].append(nxt)
                self.window.append(nxt)
                self.arrived += 1
            nxt += 1
        return nxt

    def signals(self, t: float) -> dict[str, Signals]:
        """What Serve would hand the policies at `t` (look-back means)."""
        cfg, r = self.cfg, self.req
        while self.window and r["arrive"][self.window[0]] < t - cfg.look_back_s:
            self.window.popleft()
        ids = np.fromiter(self.window, dtype=int)
        lengths = {}
        if len(ids):
            lengths = {"prompt_tokens": float(r["prompt"][ids].mean()), "prefix_hit": float(r["hit"][ids].mean()),
                       "output_tokens": float(r["output"][ids].mean())}
        held = np.fromiter(self.held, dtype=int)
        if t >= self.pushed[0] + cfg.push_s:
            self.pushed = (t, float(self.arrived))
        out = {}
        for name, pool in self.pools.items():
            q = self.ongoing[name]
            q.append((t, pool.in_flight()))
            while q[0][0] < t - cfg.look_back_s:
                q.popleft()
            deferred = float(r["prefill" if name == "prefill" else "output"][held].sum()) if len(held) else 0.0
            due = float(r["due"][held].min() - t) if len(held) else None
            out[name] = Signals(t=t, ongoing=sum(v for _, v in q) / len(q), running=pool.ready(t),
                                arrivals={"fronts": self.pushed} if name == "decode" else None,
                                arrival_rps=len(ids) / min(cfg.look_back_s, max(t, cfg.tick_s))
                                if name == "decode" else None,
                                deferrable_tokens=deferred if self.ctl.defers else 0.0,
                                deferrable_due_s=due if self.ctl.defers else None,
                                **(lengths if name == "decode" else {}))
        return out

    def _release(self, t: float, signals: dict[str, Signals]) -> None:
        """Sends held batch requests: reactive up to `batch_concurrency` in flight; forecast
        policies as spare capacity allows, and at least at the rate their deadline needs."""
        if not self.held:
            return
        if not self.ctl.defers:
            allowed = self.cfg.batch_concurrency - self.batch_in_flight
        else:
            due = signals["prefill"].deferrable_due_s
            must = len(self.held) / max(self.cfg.tick_s, (math.inf if due is None else due) - self.ctl.horizon_s)
            self._credit += max(self.ctl.batch_rps(signals, self.pools), must) * self.cfg.tick_s
            allowed = int(self._credit)
            self._credit -= allowed
        for _ in range(max(0, min(allowed, len(self.held)))):
            self.pools["prefill"].queues[1].append(self.held.popleft())
            self.batch_in_flight += 1
            self.rec.batch_sent += 1

    def _tick(self, t: float) -> None:
        signals = self.signals(t)
        for name, n in self.ctl.decide(t, signals, self.pools).items():
            if n != self.pools[name].target:
                self.rec.moved(name, t, self.pools[name].target, n)
                self.pools[name].set_target(t, n)
        self._release(t, signals)

    def _serve(self, t: float, dt: float) -> None:
        done: list = []
        self.pools["prefill"].step(t, dt, self.req["prefill"], done)
        for rid, at in done:
            self.first_token[rid] = at
            self.pools["decode"].queues[1 if self.req["batch"][rid] else 0].append(rid)
        done = []
        self.pools["decode"].step(t, dt, self.req["output"], done)
        for rid, at in done:
            self.finished[rid] = at
            if self.req["batch"][rid]:
                self.batch_in_flight -= 1

    def run(self) -> dict:
        """Replays the whole trace; returns the metrics (bench/autoscale/autoscale_metrics.py)."""
        cfg = self.cfg
        steps = int(round(self.trace.duration_s / cfg.dt_s))
        per_tick = max(1, int(round(cfg.tick_s / cfg.dt_s)))
        nxt = 0
        for i in range(steps):
            t = i * cfg.dt_s
            nxt = self._arrive(t, t + cfg.dt_s, nxt)
            if i % per_tick == 0:
                self._tick(t)
            self._serve(t, cfg.dt_s)
            self.rec.step(t, cfg.dt_s, self.pools, self.trace.rate(t))
        return self.rec.summary(self.trace, self.req, self.first_token, self.finished)


def simulate(trace: Trace, cfg: SimConfig, curves: CapacityFile, policy: str) -> dict:
    """Metrics of one policy over one trace."""
    return Simulation(trace, cfg, curves, policy).run()
