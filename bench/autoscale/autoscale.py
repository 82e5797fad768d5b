"""`baton bench autoscale`: forecast-based autoscaling against today's reactive policy.

Mode ``--sim`` (the default, bench/autoscale/autoscale_sim.py): each trace of
bench/autoscale/autoscale_traces.py (``diurnal``, ``ramp``, ``spike``, and
``diurnal_batch`` with a deferrable batch job a day) is replayed through every
policy: ``reactive`` (deployments/autoscaling.in_flight_policy's rule inside
Serve's default delays), ``constant`` (the forecast policy with a flat
forecast), ``holt`` and ``forecast`` (the same policy with Holt's damped trend
and with the Kalman local linear trend, the default, deployments/autoscaling/forecast.py).
Capacity comes from the curve file (deployments/autoscaling/capacity.py; ``--curve``,
default the shipped tiny-CPU curve). Unless ``--no-match-cost``, the constant
predictor runs again with more headroom (its utilization scaled, up to three
runs) until its replica-seconds are within 2% of the forecast's
(``constant_matched``): the forecast must beat it at equal cost, not only at
its own.

Each trace runs with every seed of ``--seeds`` (default 0 1 2); a policy's
misses, requests and replica-seconds are summed over the seeds, its direction
changes per 10 minutes are the worst seed's. Prints progress on stderr and one
JSON line on stdout: per trace and policy those metrics
(bench/autoscale/autoscale_metrics.py; series, of the first seed, only with
``--series``), and the targets of issue 34, forecast against reactive:
  - at least 50% fewer TTFT-SLO misses at no more than 10% more replica-
    seconds, on the ramp and diurnal traces;
  - at most 1 direction change per 10 compressed minutes on diurnal (every
    10-minute window, each pool);
  - fewer misses than the constant predictor at matched cost.

    python -m bench.autoscale.autoscale
    python -m bench.autoscale.autoscale --out docs/results/autoscale/sim.json --plot docs/results/autoscale/sim.png

`--real` runs the forecast and reactive policies on a real stack in
compressed time instead (bench/autoscale/autoscale_real.py, about 14 minutes).

    python -m bench.autoscale.autoscale --real --out docs/results/autoscale/real.json --plot docs/results/autoscale/real.png
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

from bench.autoscale.autoscale_metrics import aggregate
from bench.autoscale.autoscale_real import add_arguments, run_real
from bench.autoscale.autoscale_sim import POLICIES, SimConfig, simulate
from bench.autoscale.autoscale_traces import default_traces
from deployments.autoscaling.capacity import load_for_config

MISS_REDUCTION = 0.50
COST_SLACK = 0.10
MAX_CHANGES_PER_10MIN = 1
TARGET_TRACES = ("ramp", "diurnal", "ramp_real")


def _log(msg: str) -> None:
    print(f"[bench_autoscale] {msg}", file=sys.stderr, flush=True)


def _config(args: argparse.Namespace) -> SimConfig:
    return SimConfig(slo_ttft_s=args.slo, engine_start_s=args.engine_start,
                     max_replicas=args.max_replicas, cooldown_s=args.cooldown, z=args.z)


def _run_one(trace, cfg: SimConfig, curves, policy: str, label: str | None = None) -> dict:
    started = time.monotonic()
    m = simulate(trace, cfg, curves, policy)
    _log(f"{trace.name} / {label or policy} / seed {cfg.seed}: {m['ttft_slo_misses']} misses of "
         f"{m['requests']}, {m['replica_seconds']:.0f} replica-s, direction changes {m['direction_changes']} "
         f"({time.monotonic() - started:.1f} s)")
    return m


def _seed_runs(trace, cfg: SimConfig, curves, policies: list[str], match_cost: bool) -> dict[str, dict]:
    """Every policy on one seed; with `match_cost`, the constant predictor once more at the
    forecast's replica-seconds (more headroom: utilization scaled by their ratio)."""
    runs = {p: _run_one(trace, cfg, curves, p) for p in policies}
    if match_cost and {"constant", "forecast"} <= runs.keys():
        runs["constant_matched"] = _matched(trace, cfg, curves, runs["constant"], runs["forecast"]["replica_seconds"])
    return runs


def _matched(trace, cfg: SimConfig, curves, run: dict, target: float, tries: int = 3) -> dict:
    """The constant predictor with its utilization scaled until its replica-seconds are within
    2% of `target` (at most `tries` runs); the closest run, with the utilization it used."""
    best, u = None, cfg.utilization
    for _ in range(tries):
        u *= run["replica_seconds"] / target
        run = _run_one(trace, replace(cfg, utilization=u), curves, "constant", "constant_matched")
        run["utilization"] = round(u, 3)
        if best is None or abs(run["replica_seconds"] - target) < abs(best["replica_seconds"] - target):
            best = run
        if abs(run["replica_seconds"] / target - 1.0) <= 0.02:
            break
    return best


def run_sim(args: argparse.Namespace) -> dict:
    """Every policy over every trace and seed (one workload per trace and seed, the same for
    every policy); progress on stderr."""
    cfg = _config(args)
    curves = load_for_config(None, args.curve)
    traces = default_traces(day_s=args.day)
    out = {}
    for name in args.traces:
        trace = traces[name]
        by_seed = [_seed_runs(trace, replace(cfg, seed=s), curves, args.policies, args.match_cost)
                   for s in args.seeds]
        policies = {p: aggregate([runs[p] for runs in by_seed], args.seeds) for p in by_seed[0]}
        out[name] = {"duration_s": trace.duration_s, "batch_jobs": [list(j) for j in trace.batch_jobs],
                     "policies": policies}
    return {"config": asdict(cfg), "seeds": args.seeds,
            "curve": args.curve or "deployments/autoscaling/capacity_tiny_cpu.yaml", "traces": out}


MODES: dict[str, Callable[[argparse.Namespace], dict]] = {"sim": run_sim, "real": run_real}


def _reduction(new: float, old: float) -> float | None:
    return None if not old else round(1.0 - new / old, 3)


def targets(traces: dict[str, dict]) -> dict:
    """Issue 34's targets, forecast against reactive (and the constant predictor)."""
    out: dict = {}
    for name in TARGET_TRACES:
        pol = traces.get(name, {}).get("policies", {})
        fc, re = pol.get("forecast"), pol.get("reactive")
        if fc is None or re is None:
            continue
        misses = _reduction(fc["ttft_slo_misses"], re["ttft_slo_misses"])
        cost = round(fc["replica_seconds"] / re["replica_seconds"] - 1.0, 3)
        out[f"{name}_miss_reduction"] = misses
        out[f"{name}_replica_seconds_change"] = cost
        out[f"{name}_ok"] = misses is not None and misses >= MISS_REDUCTION and cost <= COST_SLACK
        oracle = traces[name].get("oracle")
        if oracle:  # what a clairvoyant policy with no engine start would spend against reactive
            out[f"{name}_oracle_replica_seconds_change"] = oracle["peak_measured"]["against_reactive"]
        const = pol.get("constant_matched") or pol.get("constant")
        if const is not None:
            out[f"{name}_beats_constant_ok"] = fc["ttft_slo_misses"] < const["ttft_slo_misses"]
    diurnal = traces.get("diurnal", {}).get("policies", {}).get("forecast")
    if diurnal is not None:
        out["diurnal_max_direction_changes_per_10min"] = diurnal["max_direction_changes_per_10min"]
        out["diurnal_direction_changes_ok"] = diurnal["max_direction_changes_per_10min"] <= MAX_CHANGES_PER_10MIN
    out["met"] = bool(out) and all(v for k, v in out.items() if k.endswith("_ok"))
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    d = SimConfig()
    p = argparse.ArgumentParser(prog="baton bench autoscale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--sim", dest="mode", action="store_const", const="sim",
                      help="simulated pools driving the real policy objects (default)")
    mode.add_argument("--real", dest="mode", action="store_const", const="real",
                      help="forecast and reactive on a real colocated stack, compressed time")
    p.set_defaults(mode="sim")
    add_arguments(p)
    p.add_argument("--traces", nargs="+", default=list(default_traces()), choices=list(default_traces()))
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    p.add_argument("--curve", default=None, help="capacity curve file (default: the shipped tiny-CPU curve)")
    p.add_argument("--day", type=float, default=1800.0, help="seconds of a compressed day (diurnal traces)")
    p.add_argument("--slo", type=float, default=d.slo_ttft_s, help="TTFT SLO, seconds")
    p.add_argument("--engine-start", type=float, default=d.engine_start_s, help="a new replica's start, seconds")
    p.add_argument("--max-replicas", type=int, default=d.max_replicas, help="per pool")
    p.add_argument("--cooldown", type=float, default=d.cooldown_s, help="one direction change per this long")
    p.add_argument("--z", type=float, default=d.z, help="forecast margin in standard errors")
    p.add_argument("--no-match-cost", dest="match_cost", action="store_false",
                   help="skip the constant predictor at the forecast's replica-seconds")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                   help="workload seeds; each policy's counts are summed over them")
    p.add_argument("--series", action="store_true", help="keep the time series in the JSON")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    p.add_argument("--plot", type=Path, default=None, help="replicas and load over time (PNG)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started = time.monotonic()
    doc = {"mode": args.mode, **MODES[args.mode](args)}
    doc["targets"] = targets(doc["traces"])
    if args.plot is not None:
        from bench.autoscale.autoscale_plot import plot

        plot(doc, args.plot)
        doc["plot"] = str(args.plot)
    if not args.series:
        for tr in doc["traces"].values():
            for m in tr["policies"].values():
                m.pop("series", None)
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    _log(f"targets: {json.dumps(doc['targets'])}")
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
