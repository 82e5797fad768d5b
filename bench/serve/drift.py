"""How one long-running server's speed drifts over minutes: Baton colocated, then `vllm serve`.

    python -m bench.serve.drift --rounds 12 --out /tmp/drift.json

Each system is started once and then gets `--rounds` rounds of the same c1
load as `baton bench serve` (100 requests each, prompts of their own per
round), back to back; the systems run one after the other. A `baton bench
serve` round gives each system about 40 s on a fresh server, so on a VM
whose speed wanders over minutes it catches each system in whatever phase
it meets; here both see many phases, and the spread of each system's own
rounds says how far a single round can be trusted. Prints one JSON line per
round and a summary (mean, min, max per system).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.common import vllm_load
from bench.serve.serve import started
from bench.common.stack import bench_workdir
from common.config import load_config


def rounds(system: str, n: int, requests: int) -> list[dict]:
    """`n` rounds of `requests` c1 requests against one server of `system`."""
    cfg = load_config(None, environ={})
    model, tokenizer = cfg.model.served_name, str(cfg.model.resolved_path())
    out = []
    with started(system, bench_workdir("drift"), cfg) as url:
        vllm_load.run(url, model, tokenizer, vllm_load.Workload(20, 1, seed=5))  # warm-up
        for i in range(n):
            r = vllm_load.run(url, model, tokenizer, vllm_load.Workload(requests, 1, seed=40 + i))
            out.append({"system": system, "round": i, "req_s": r["request_throughput"],
                        "tpot_p50_ms": r["median_tpot_ms"]})
            print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serve.drift", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--systems", default="baton_colocated,vllm_serve")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    doc: dict = {"rounds": [], "summary": {}}
    for system in args.systems.split(","):
        rs = rounds(system, args.rounds, args.requests)
        doc["rounds"] += rs
        xs = [r["req_s"] for r in rs]
        doc["summary"][system] = {"mean_req_s": round(sum(xs) / len(xs), 3), "min": min(xs), "max": max(xs)}
    print(json.dumps(doc, indent=1))
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
