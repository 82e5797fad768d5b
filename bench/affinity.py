"""`baton bench affinity`: session-affinity routing against round-robin, on the real stack.

One run starts Baton twice with the same pools (1 prefill, 2 decode replicas
by default), once with `routing.policy: baton` and once with `round_robin`,
and replays the same agentic workload: S sessions of T turns, each turn
resending the whole conversation with its `x-session-affinity` header. It
prints one JSON line with the TTFT of turn 1 and of turns 2+ per policy and
the ratios baton / round_robin measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys

from bench import loadgen
from bench.load import run
from common.stats import percentile
from bench.stack import StackProcess, bench_workdir, write_config


def _turn_stats(results) -> dict:
    ok = [r for r in results if r.ok]
    first = [r.ttft_s for r in ok if r.turn == 0]
    later = [r.ttft_s for r in ok if r.turn > 0]
    return {
        "requests_ok": len(ok), "errors": len(results) - len(ok),
        "ttft_turn1_p50_s": percentile(first, 50),
        "ttft_turn2plus_p50_s": percentile(later, 50),
        "ttft_turn2plus_p90_s": percentile(later, 90),
        "cached_share_turn2plus": (sum(r.cached_tokens or 0 for r in ok if r.turn > 0)
                                   / max(1, sum(r.input_tokens or 0 for r in ok if r.turn > 0))),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baton bench affinity", description=__doc__)
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--words-per-turn", type=int, default=120)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--decode-replicas", type=int, default=2)
    args = parser.parse_args(argv)
    workdir = bench_workdir("bench-affinity")
    out: dict = {"workload": vars(args)}
    for policy in ("baton", "round_robin"):
        specs = loadgen.synthetic_workload("agentic", args.sessions, seed=1, turns=args.turns,
                                           input_tokens=args.words_per_turn,
                                           output_tokens=args.output_tokens)
        stack = StackProcess(write_config(workdir / policy, decode={"replicas": args.decode_replicas},
                                          routing={"policy": policy}, tracing={"exporter": "none"}))
        print(f"starting baton with routing.policy={policy} ...", file=sys.stderr, flush=True)
        stack.start()
        try:
            results, _ = run(stack.url, specs, concurrency=args.concurrency, label=policy)
        finally:
            stack.stop()
        out[policy] = _turn_stats(results)
    b, rr = out["baton"], out["round_robin"]
    out["ratio_baton_to_round_robin"] = {
        k: round(b[k] / rr[k], 3) for k in ("ttft_turn1_p50_s", "ttft_turn2plus_p50_s", "ttft_turn2plus_p90_s")
        if b[k] and rr[k]}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
