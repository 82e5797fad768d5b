"""The core fence on and off in alternate rounds of one colocated stack (common/core_fence.py).

    python -m bench.serve.fence_ab --order 10011001 --out /tmp/fence_ab.json

One `baton up` (colocated, one replica: vLLM binds its worker to a core),
then for each character of `--order` ("1" fenced, "0" not): every process
of the stack but the engine's worker gets its CPUs set (fenced: the cores
the worker is not bound to; not: all of this process's), and the same load
as `baton bench serve` runs at concurrency 8 and then 1, each round with
prompts of its own. One stack for every round takes the stack-to-stack
noise out of the comparison; the order alternates so that drift over time
falls on both sides. Prints one JSON line per round and the sums.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from bench.common import vllm_load
from bench.common.stack import StackProcess, bench_workdir, write_config
from common import core_fence
from common.config import load_config


def _set_cpus(root: int, fenced: bool) -> None:
    pids = core_fence.tree(root)
    if fenced:
        core_fence.fence(pids)
    else:
        core_fence.move(pids, os.sched_getaffinity(0))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serve.fence_ab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--order", default="10011001", help="1 fenced, 0 not, one round each")
    p.add_argument("--c8-requests", type=int, default=250)
    p.add_argument("--c1-requests", type=int, default=100)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    cfg = load_config(None, environ={})
    model, tokenizer = cfg.model.served_name, str(cfg.model.resolved_path())
    stack = StackProcess(write_config(bench_workdir("fence-ab"), colocated=True, tracing={"exporter": "none"}))
    stack.start()
    rounds = []
    try:
        vllm_load.run(stack.url, model, tokenizer, vllm_load.Workload(20, 1, seed=5))  # warm-up
        for i, flag in enumerate(args.order):
            _set_cpus(stack.proc.pid, flag == "1")
            r8 = vllm_load.run(stack.url, model, tokenizer, vllm_load.Workload(args.c8_requests, 8, seed=10 + i))
            r1 = vllm_load.run(stack.url, model, tokenizer, vllm_load.Workload(args.c1_requests, 1, seed=30 + i))
            rounds.append({"fenced": flag == "1", "c8_req_s": r8["request_throughput"],
                           "c1_req_s": r1["request_throughput"], "c8_tpot_p50_ms": r8["median_tpot_ms"],
                           "c1_tpot_p50_ms": r1["median_tpot_ms"]})
            print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    finally:
        stack.stop()
    sums = {f"{side}_{load}": round(sum(r[f"{load}_req_s"] for r in rounds if r["fenced"] == (side == "fenced")), 2)
            for side in ("fenced", "unfenced") for load in ("c8", "c1")}
    for load in ("c8", "c1"):
        if sums[f"unfenced_{load}"]:
            sums[f"{load}_ratio"] = round(sums[f"fenced_{load}"] / sums[f"unfenced_{load}"], 3)
    doc = {"order": args.order, "rounds": rounds, "sums": sums}
    print(json.dumps(doc, indent=1))
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
