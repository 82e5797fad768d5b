"""What a clairvoyant policy would spend on a trace: the floor under any policy's replica-seconds.

The oracle knows the rate at every moment and has no engine start: each
replica runs from the instant the trace's rate passes what the replicas
already running carry, and stops the instant it falls back (within the
pool's min and max). It bounds what the bar "at most 10% more
replica-seconds than reactive" can ask of a real run: a reactive policy that
lets its queue build spends less than the oracle by serving late, and no
policy that serves the load in time can spend less than the oracle.

Two capacities per replica are given: the rate the forecast plans a replica
at (its SLO-sized batch at the planned utilization) and the most the
calibration measured (its largest batch, the SLO not counted). The second
is the lowest floor there is on the measured curve.

`python -m bench.autoscale.autoscale_oracle RESULT.json` adds the oracle to a recorded
`--real` result (it reads the run's own trace settings and calibration) and
prints it. Pure functions apart from that command: no clock, no Ray.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from bench.autoscale.autoscale_traces import Trace, held_ramp


def replicas_needed(rate_rps: float, per_replica_rps: float, lo: int, hi: int) -> int:
    """The fewest replicas (within [lo, hi]) that carry `rate_rps` at `per_replica_rps` each."""
    if per_replica_rps <= 0:
        raise ValueError("per_replica_rps must be > 0")
    return max(lo, min(hi, math.ceil(rate_rps / per_replica_rps - 1e-9)))


def replica_seconds(trace: Trace, per_replica_rps: float, duration_s: float, lo: int, hi: int,
                    dt: float = 0.1) -> float:
    """Replica-seconds of the oracle over [0, duration_s): replicas_needed at the middle of each
    `dt` step, integrated."""
    steps = int(round(duration_s / dt))
    return sum(replicas_needed(trace.rate((i + 0.5) * dt), per_replica_rps, lo, hi) for i in range(steps)) * dt


def for_real_run(result: dict) -> dict:
    """The oracle's replica-seconds for a recorded `baton bench autoscale --real` result, at the
    planned and at the peak measured rate a replica, and each policy's spend against them."""
    cfg, run = result["config"], result["traces"]["ramp_real"]
    calib = cfg.get("calibration") or {}
    curve = calib.get("curve")
    if not curve:
        raise ValueError("the result has no calibration curve: nothing to size replicas by")
    trace = held_ramp(run["low_rps"], run["high_rps"], run["ramp_s"], run["warm_s"])
    peak = max(p["tokens_per_s"] for p in curve["points"]) / curve["tokens_per_request"]
    out = {}
    for name, rps in (("planned", calib["planned_rps_per_replica"]), ("peak_measured", peak)):
        rs = replica_seconds(trace, rps, run["duration_s"], 1, cfg["max_replicas"])
        out[name] = {"per_replica_rps": round(rps, 2), "replica_seconds": round(rs, 1),
                     "policies_against_it": {p: round(m["replica_seconds"] / rs, 3)
                                             for p, m in run["policies"].items()}}
    reactive = run["policies"].get("reactive")
    if reactive:
        for entry in out.values():
            entry["against_reactive"] = round(entry["replica_seconds"] / reactive["replica_seconds"] - 1, 3)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", type=Path, help="a `baton bench autoscale --real` JSON result")
    parser.add_argument("--write", action="store_true", help="store the oracle in the result file")
    args = parser.parse_args(argv)
    result = json.loads(args.result.read_text())
    oracle = for_real_run(result)
    print(json.dumps(oracle, indent=2))
    if args.write:
        result["traces"]["ramp_real"]["oracle"] = oracle
        args.result.write_text(json.dumps(result, indent=1) + "\n")  # as `baton bench` writes it


if __name__ == "__main__":
    main()
