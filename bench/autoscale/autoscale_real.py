"""`baton bench autoscale --real`: the forecast and reactive policies on a real stack, compressed time.

For each policy, one colocated `baton up` stack whose decode pool has an
`autoscaling` section (1 to `max_replicas` replicas): `forecast` sets
`autoscaling.forecast` (deployments/autoscaling.PoolForecastPolicy in Serve's
controller, fed by the replicas' SignalMeter), `reactive` leaves it out
(in_flight_policy with Serve's own delays). Both run the same open-loop load:
Poisson arrivals whose rate follows a ramp (`--real-low` req/s, then a linear
rise to `--real-high` over `--real-ramp` seconds, then held), each request a
streamed chat of 300 words (804 prompt tokens) and 64 output tokens, its TTFT
measured by the client. A Ray driver beside the stack reads Serve's replica
states every second.

Time is compressed: Serve's replicas push their metrics every second (not
10), and the forecast bins 2 s, refits every 20 s, and looks ahead the
engine start (`--real-engine-start`: 60 s, a replica capped at 0.5 cores
here; 45 s uncapped). With 5 s bins it met the ramp late: its local linear
trend took longer to believe the rise (docs/history.md). Per policy it
reports TTFT p50/p99, the requests over the SLO, replica-seconds (running
replicas integrated over the run), when the second replica was asked for and
when it ran, and the series for the plot (bench/autoscale/autoscale_plot.py).

On a machine with few cores every replica shares them: uncapped, a second
replica adds no compute, and its engine's start takes CPU from the first.
So where cgroups allow it, each replica is capped at `--real-replica-cpu`
cores (`resources.cpu_quota`, common/cpu_slice.py), as if each had a machine
of its own, and one replica so capped is measured first
(bench/autoscale/autoscale_calibrate.py): the forecast sizes replicas by that curve,
and the ramp runs from half of what one replica is planned to carry to what
`--real-max-replicas` replicas are planned to carry (unless `--real-low` and
`--real-high` are given): beyond what one replica serves, within what the
pool at its bound serves. A top of 4 replicas' rate on a pool of 3 (the
default before) overloaded both policies whenever the planned rate came
close to the measured peak (27.3 req/s against 3 x 8.5 measured: 68% and
95% of requests over the SLO).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from bench.autoscale import autoscale_calibrate, autoscale_oracle
from bench.autoscale.autoscale_traces import Trace, held_ramp
from bench.common.stack import StackProcess, bench_workdir, write_config
from cluster import loopback
from common import cpu_slice
from common.constants import REPO_ROOT
from deployments.autoscaling.scale_policy import PolicyParams

PUSH_ENV = "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S"
REPLICA_CPU = 0.5  # cores per replica: three take 1.5 of 2, the client and Ray's daemons the rest
# The ramp's bottom, of one replica's planned rate; its top is what the pool's bound carries.
LOW_SHARE = 0.5
# The share of the TTFT SLO a replica's own TTFT p90 at its batch may take (the calibration measures
# it; before it did, a colocated curve's service time was a whole answer and needed most of the SLO).
# Not all of it: the rest is the queue wait beyond which the policy adds a replica at once (with 1.0
# any wait at all did, and the first run asked for its third replica at 8.5 s).
SERVICE_FRACTION = 0.8
CORPUS = ("tool", "result", "json", "status", "ok", "value", "agent", "session", "cache", "prefix",
          "token", "block", "replica", "forecast", "ramp", "serve")

# Polls Serve for the app's decode deployment: one JSON line per second, until killed.
WATCH = """
import json, sys, time
import ray
from ray import serve
ray.init(address=sys.argv[1], namespace="baton", logging_level="ERROR", log_to_driver=False)
while True:
    app = serve.status().applications.get("baton")
    dep = app.deployments.get("decode") if app else None
    states = {str(getattr(k, "value", k)).lower(): v for k, v in (dep.replica_states if dep else {}).items()}
    print(json.dumps({"t": time.time(), **states}), flush=True)
    time.sleep(1.0)
"""


def real_trace(args) -> Trace:
    """The run's rate trace: bench/autoscale/autoscale_traces.py's ramp, held at its top to the end."""
    return held_ramp(args.real_low, args.real_high, args.real_ramp, args.real_warm)


def _autoscaling(policy: str, args) -> dict:
    section = {"min_replicas": 1, "max_replicas": args.real_max_replicas, "target_ongoing_requests": 4}
    if policy == "forecast":
        section["forecast"] = {"forecaster": "kalman", "step_s": 2.0, "window": 60, "refit_s": 20.0,
                               "engine_start_s": args.real_engine_start, "signal_lag_s": 1.0,
                               "slo_ttft_s": args.slo, "service_fraction": SERVICE_FRACTION,
                               "downscale_delay_s": 30.0, "cooldown_s": 60.0}
        if args.capacity_file:
            section["forecast"]["capacity_file"] = str(args.capacity_file)
    return section


def _body(i: int, rng: random.Random) -> dict:
    words = " ".join(rng.choice(CORPUS) for _ in range(300))
    return {"model": "baton-tiny", "messages": [{"role": "user", "content": f"request {i}: {words}"}],
            "max_tokens": 64, "temperature": 0, "ignore_eos": True, "stream": True}


async def _one(client: httpx.AsyncClient, url: str, i: int, rng: random.Random) -> tuple[float, float | None]:
    body = _body(i, rng)
    t0 = time.monotonic()
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return t0, None
            ttft = None
            async for line in r.aiter_lines():
                if ttft is None and line.startswith("data: ") and '"content"' in line:
                    ttft = time.monotonic() - t0
            return t0, ttft
    except httpx.HTTPError:
        return t0, None


async def _load(url: str, args, seed: int) -> list[tuple[float, float | None]]:
    """Open-loop Poisson arrivals over the ramp; (send time, TTFT or None on failure) per request."""
    rng, rate_at = random.Random(seed), real_trace(args).rate
    start, tasks, i = time.monotonic(), [], 0
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=256)) as client:
        while (t := time.monotonic() - start) < args.real_duration:
            await asyncio.sleep(rng.expovariate(rate_at(t)))
            tasks.append(asyncio.ensure_future(_one(client, url, i, rng)))
            i += 1
        done = await asyncio.gather(*tasks)
    return [(t0 - start, ttft) for t0, ttft in done]


def _watch(stack: StackProcess) -> subprocess.Popen:
    state = stack.state()
    env = {**os.environ, "RAY_AUTH_MODE": "token", **loopback.ray_env()}
    return subprocess.Popen([sys.executable, "-c", WATCH, state["ray_address"]], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=REPO_ROOT, env=env)


def run_policy(policy: str, args, workdir: Path, seed: int = 0) -> dict:
    """One stack under `policy` in `workdir`, the ramp's load through it; the policy's figures
    and series."""
    os.environ[PUSH_ENV] = "1.0"  # inherited by `baton up` and so by Ray's processes
    resources = {"cpu_quota": args.real_replica_cpu} if args.real_replica_cpu else {}
    stack = StackProcess(write_config(workdir, colocated=True, tracing={"exporter": "none"}, decode={
        "replicas": 1, "resources": resources, "autoscaling": _autoscaling(policy, args)}))
    print(f"[autoscale --real] {policy}: starting the stack", file=sys.stderr, flush=True)
    stack.start()
    watcher = _watch(stack)
    try:
        t_start = time.time()
        print(f"[autoscale --real] {policy}: {args.real_duration:.0f} s of load", file=sys.stderr, flush=True)
        sent = asyncio.run(_load(stack.url, args, seed))
        time.sleep(2)
    finally:
        watcher.kill()
        lines = watcher.stdout.read().splitlines()
        assert stack.stop() == 0, stack.tail()
    states = [json.loads(x) for x in lines if x.startswith("{")]
    return summarise(policy, sent, [(s["t"] - t_start, s) for s in states], args)


def summarise(policy: str, sent: list[tuple[float, float | None]], states: list[tuple[float, dict]],
              args) -> dict:
    """The policy's figures from what the client saw and what Serve said, in the sim's shape."""
    ok = sorted(ttft for _, ttft in sent if ttft is not None)
    misses = [t for t, ttft in sent if ttft is None or ttft > args.slo]
    states = [(t, s) for t, s in states if 0 <= t <= args.real_duration]
    running = [(t, s.get("running", 0)) for t, s in states]
    # Serve's target: every replica it keeps or is starting (not those stopping).
    asked = [(t, sum(v for k, v in s.items() if k not in ("t", "stopping"))) for t, s in states]
    replica_s = sum((t2 - t1) * n for (t1, n), (t2, _) in zip(running, running[1:]))
    changes, last, prev = 0, None, None
    for _, n in asked:
        if prev is not None and n != prev:
            d = 1 if n > prev else -1
            changes += last is not None and d != last
            last = d
        prev = n
    ends, trace = [t for t, _ in states[1:]] + [args.real_duration], real_trace(args)
    series = [{"t": round(t, 1), "decode_target": n, "prefill_target": 0, "running": r,
               "rate": trace.rate(t),
               "ttft_misses": sum(1 for m in misses if t <= m < end)}
              for (t, n), (_, r), end in zip(asked, running, ends)]

    def first(pairs, above: int):
        return next((round(t, 1) for t, n in pairs if n > above), None)

    pct = lambda q: round(ok[min(len(ok) - 1, int(q * len(ok)))], 3) if ok else None  # noqa: E731
    return {"requests": len(sent), "failed": sum(1 for _, x in sent if x is None), "ttft_slo_misses": len(misses),
            "ttft_p50_s": pct(0.5), "ttft_p99_s": pct(0.99), "replica_seconds": round(replica_s, 1),
            "direction_changes": {"decode": changes}, "second_replica_asked_s": first(asked, 1),
            "second_replica_running_s": first(running, 1), "most_replicas_asked": max((n for _, n in asked), default=0),
            "series": series}


def _prepare(args, workdir: Path) -> dict:
    """The replica cap, the measured curve and the ramp's rates (set on `args`); what was measured."""
    if args.real_replica_cpu is None:
        args.real_replica_cpu = REPLICA_CPU if cpu_slice.available() else 0.0
    args.capacity_file = None
    if not args.real_replica_cpu and args.real_low and args.real_high:
        return {}
    args.capacity_file = autoscale_calibrate.calibrate(workdir, args.real_replica_cpu, args.real_calibrate_s,
                                                       _one, _body(0, random.Random(0)))
    curve = yaml.safe_load(args.capacity_file.read_text())["pools"]["colocated"]
    planned = autoscale_calibrate.planned_rps(curve, PolicyParams(slo_ttft_s=args.slo,
                                                                  service_fraction=SERVICE_FRACTION))
    args.real_low = args.real_low or round(LOW_SHARE * planned, 2)
    args.real_high = args.real_high or round(args.real_max_replicas * planned, 2)
    return {"curve": curve, "planned_rps_per_replica": round(planned, 2)}


def run_real(args) -> dict:
    """Both policies, forecast first; {"traces": {"ramp_real": ...}} as MODES wants."""
    policies, workdir = {}, bench_workdir("autoscale-real")
    calibration = _prepare(args, workdir)
    try:
        for policy in ("forecast", "reactive"):
            _run_one(policies, policy, args, workdir)
    finally:
        cpu_slice.sweep("replica-")
    trace = {"duration_s": args.real_duration, "low_rps": args.real_low, "high_rps": args.real_high,
             "warm_s": args.real_warm, "ramp_s": args.real_ramp, "policies": policies}
    doc = {"config": {"slo_ttft_s": args.slo, "max_replicas": args.real_max_replicas,
                      "engine_start_s": args.real_engine_start, "metric_push_interval_s": 1.0,
                      "replica_cpu_cores": args.real_replica_cpu or None, "calibration": calibration},
           "traces": {"ramp_real": trace}}
    if calibration:  # the floor under any on-time policy's replica-seconds (bench/autoscale/autoscale_oracle.py)
        trace["oracle"] = autoscale_oracle.for_real_run(doc)
    return doc


def _run_one(policies: dict, policy: str, args, workdir: Path) -> None:
    policies[policy] = m = run_policy(policy, args, workdir / policy)
    print(f"[autoscale --real] {policy}: {m['ttft_slo_misses']} misses of {m['requests']}, "
          f"TTFT p50 {m['ttft_p50_s']} s p99 {m['ttft_p99_s']} s, {m['replica_seconds']} replica-s, "
          f"second replica asked at {m['second_replica_asked_s']} s, running at "
          f"{m['second_replica_running_s']} s", file=sys.stderr, flush=True)


def add_arguments(p) -> None:
    """The --real run's options on `baton bench autoscale`'s parser."""
    p.add_argument("--real-low", type=float, default=None,
                   help="--real: requests/s before the ramp; default: 0.5 of one replica's planned rate")
    p.add_argument("--real-high", type=float, default=None,
                   help="--real: requests/s at the ramp's top; default: what --real-max-replicas "
                   "replicas are planned to carry")
    p.add_argument("--real-replica-cpu", type=float, default=None,
                   help=f"--real: cores per replica (resources.cpu_quota); 0: uncapped; default {REPLICA_CPU} "
                   "where cgroups allow it")
    p.add_argument("--real-calibrate-s", type=float, default=15.0,
                   help="--real: seconds per batch size of the one-replica calibration")
    p.add_argument("--real-max-replicas", type=int, default=3, help="--real: the decode pool's bound")
    p.add_argument("--real-warm", type=float, default=60.0, help="--real: seconds at the low rate first")
    p.add_argument("--real-ramp", type=float, default=120.0, help="--real: seconds of the rise")
    p.add_argument("--real-duration", type=float, default=420.0, help="--real: seconds of load in all")
    p.add_argument("--real-engine-start", type=float, default=60.0,
                   help="--real: a new replica's start to serving here, seconds (the forecast's look-ahead)")
