"""`baton bench overload`: goodput and per-tenant shares at 1x, 2x and 5x capacity.

Starts the real stack with two tenants (API keys), measures its capacity in
requests/s with a closed-loop burst, then offers Poisson load at 1x, 2x and
5x that capacity: tenant `heavy` sends 10/11 of it, tenant `light` 1/11. For
each level it prints goodput (requests/s that succeed within the TTFT SLO),
each tenant's successes against its max-min fair share, and the status codes
seen: every rejection should be a 429 with Retry-After, never a 5xx.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

from bench import loadgen
from bench.load import run
from bench.loadgen import CHAT, RequestSpec
from bench.stack import StackProcess, bench_workdir, write_config
from deployments.admission import max_min_fair_share

KEYS = {"heavy": "key-heavy", "light": "key-light"}


def _specs(rate: float, duration_s: float, seed: int, max_tokens: int, deadline_s: float) -> list[RequestSpec]:
    specs: list[RequestSpec] = []
    for tenant, share in (("heavy", 10 / 11), ("light", 1 / 11)):
        n = max(1, round(rate * share * duration_s))
        for at in loadgen.poisson_arrivals(n, rate * share, seed + len(specs)):
            specs.append(RequestSpec(
                index=len(specs), at_s=at, endpoint=CHAT, session_id=tenant,
                body={"messages": [{"role": "user", "content": f"{tenant} request {len(specs)}"}],
                      "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
                headers={"authorization": f"Bearer {KEYS[tenant]}", "x-baton-deadline-s": str(deadline_s)},
                output_tokens=max_tokens))
    return specs


def _status(r) -> int:
    if r.ok:
        return 200
    m = re.search(r"HTTP (\d+)", r.error or "")
    return int(m.group(1)) if m else 0  # 0: transport error or timeout


def _level(url: str, capacity_rps: float, x: float, args) -> dict:
    # The queueing deadline is the TTFT SLO: a request that cannot start in
    # time is told so at once (429) instead of waiting to miss it.
    specs = _specs(capacity_rps * x, args.duration, args.seed, args.max_tokens, args.slo_ttft)
    start = time.perf_counter()
    results, _ = run(url, specs, timeout_s=60, slo_ttft_s=args.slo_ttft, label=f"{x:g}x")
    wall = time.perf_counter() - start
    by_tenant: dict[str, dict] = {}
    ok_total = {t: sum(1 for s, r in zip(specs, results) if s.session_id == t and r.ok) for t in KEYS}
    sent = {t: sum(1 for s in specs if s.session_id == t) for t in KEYS}
    fair = max_min_fair_share({t: sent[t] / args.duration for t in KEYS}, {t: 1.0 for t in KEYS},
                              capacity_rps)
    for t in KEYS:
        mine = [(s, r) for s, r in zip(specs, results) if s.session_id == t]
        codes: dict[str, int] = {}
        for _, r in mine:
            codes[str(_status(r))] = codes.get(str(_status(r)), 0) + 1
        by_tenant[t] = {"sent": sent[t], "succeeded": ok_total[t], "status_codes": codes,
                        "share_of_successes": round(ok_total[t] / max(1, sum(ok_total.values())), 3),
                        "pct_of_fair_share": round(100 * ok_total[t] / args.duration / fair[t], 1)}
    good = sum(1 for r in results if r.ok and r.ttft_s <= args.slo_ttft)
    return {"offered_rps": round(capacity_rps * x, 2), "goodput_rps": round(good / wall, 2),
            "tenants": by_tenant}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baton bench overload", description=__doc__)
    parser.add_argument("--duration", type=float, default=20, help="seconds of load per level")
    parser.add_argument("--levels", default="1,2,5", help="offered load as multiples of capacity")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--slo-ttft", type=float, default=2.0)
    parser.add_argument("--capacity-per-replica", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    workdir = bench_workdir("bench-overload")
    stack = StackProcess(write_config(
        workdir, tracing={"exporter": "none"},
        serve={"api_keys": {KEYS["heavy"]: "heavy", KEYS["light"]: "light"}},
        admission={"capacity_per_replica": args.capacity_per_replica}))
    print("starting baton ...", file=sys.stderr, flush=True)
    stack.start()
    try:
        burst = loadgen.synthetic_workload("decode-heavy", 4 * args.capacity_per_replica, seed=args.seed,
                                           input_tokens=16, output_tokens=args.max_tokens)
        for s in burst:
            s.headers["authorization"] = f"Bearer {KEYS['light']}"
        t0 = time.perf_counter()
        calib, _ = run(stack.url, burst, concurrency=args.capacity_per_replica, label="calibrate")
        capacity = sum(1 for r in calib if r.ok) / (time.perf_counter() - t0)
        out = {"capacity_rps": round(capacity, 2), "duration_s": args.duration, "levels": {}}
        for x in (float(v) for v in args.levels.split(",")):
            out["levels"][f"{x:g}x"] = _level(stack.url, capacity, x, args)
    finally:
        stack.stop()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
