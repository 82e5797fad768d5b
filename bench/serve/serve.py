"""`baton bench serve`: Baton against `vllm serve` and Ray Serve LLM, same run.

Systems, each started in turn on the same model and engine settings and on
free loopback ports (Ray's HAProxy mode binds all interfaces, see
docs/security.md):

- `vllm_serve`: vLLM's own OpenAI server, the limit any wrapper is judged by;
- `ray_serve_llm`: Ray Serve LLM's default `build_openai_app`;
- `ray_serve_llm_fast`: Ray Serve LLM at its fastest (HAProxy, direct
  streaming, throughput-optimized);
- `baton_colocated`, `baton_disaggregated`: Baton's two modes;
- `baton_disaggregated_two_step` (only when named in `--systems`):
  disaggregated with `routing.prefill_first_token` off, so the first token
  waits for the KV transfer and decode's first step, as before that path.

Each system gets the same load from vLLM's own benchmark (bench/common/vllm_load.py):
400 uniformly random tokens per prompt, 64 output tokens, streamed, at
concurrency 8 and at concurrency 1, each load with prompts of its own: no
prompt shares a prefix block with another, so every system computes every
prompt. The whole sequence runs `--rounds` times (2 by default), every
other round in reverse order (A B, then B A), so
the noise between rounds is visible next to the differences between systems.
One JSON document goes to stdout (and `--out`); ratios are to `vllm serve`
and to Ray Serve LLM at its fastest within the same round.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from bench.common import vllm_load
from bench.common.peers import RayServeLLM, VllmServe
from bench.common.report import emit
from bench.common.stack import StackProcess, bench_workdir, write_config
from common.config import load_config

SYSTEMS = ("vllm_serve", "ray_serve_llm", "ray_serve_llm_fast", "baton_colocated", "baton_disaggregated")
OPTIONAL = ("baton_disaggregated_two_step", "baton_colocated_direct")  # the latter: serve.ingress direct


@contextmanager
def started(system: str, workdir: Path, cfg, speculation: str | None = None):
    """The system's base URL while it runs; stops it on exit. `speculation`: a method
    Baton's decode pool runs (common/config/spec.py); the peers never speculate."""
    if system == "vllm_serve":
        with VllmServe(cfg, workdir / "vllm-serve.log") as s:
            yield s.url
    elif system.startswith("ray_serve_llm"):
        with RayServeLLM(workdir / f"{system}.log", fast=system.endswith("fast")) as s:
            yield s.url
    else:
        routing = {"prefill_first_token": False} if system.endswith("two_step") else {}
        decode = {"speculation": {"method": speculation}} if speculation else {}
        serve = {"ingress": "direct"} if system.endswith("direct") else {}
        stack = StackProcess(write_config(workdir / system, colocated=system.startswith("baton_colocated"),
                                          tracing={"exporter": "none"}, routing=routing, decode=decode, serve=serve))
        stack.start()
        try:
            yield stack.url
        finally:
            stack.stop()


def measure(system: str, workdir: Path, loads: dict[str, vllm_load.Workload], speculation: str | None = None) -> dict:
    cfg = load_config(None, environ={})
    t0 = time.monotonic()
    print(f"  starting {system} ...", file=sys.stderr, flush=True)
    with started(system, workdir, cfg, speculation) as url:
        print(f"  {system} ready after {time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)
        out = {}
        for name, w in loads.items():
            out[name] = vllm_load.run(url, cfg.model.served_name, str(cfg.model.resolved_path()), w)
            r = out[name]
            print(f"    {name}: {r['request_throughput']:.2f} req/s, TTFT p50 {r['median_ttft_ms']:.0f} ms, "
                  f"TPOT p50 {r['median_tpot_ms']:.1f} ms, failed {r['failed']}", file=sys.stderr, flush=True)
    return out


def ratios(results: dict[str, dict], base: str) -> dict:
    """Each system's req/s, TTFT p50 and TPOT p50 over `base`'s, per load."""
    if base not in results:
        return {}
    keys = ("request_throughput", "median_ttft_ms", "median_tpot_ms")
    return {sys_: {load: {k: round(r[k] / results[base][load][k], 3) for k in keys if results[base][load][k]}
                   for load, r in loads.items()}
            for sys_, loads in results.items() if sys_ != base}


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(doc["rounds"][0]["results"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, load in zip(axes, ("c8", "c1")):
        for i, rnd in enumerate(doc["rounds"]):
            vals = [rnd["results"][s][load]["request_throughput"] for s in systems]
            ax.bar([x + 0.4 * i for x in range(len(systems))], vals, width=0.4, label=f"round {i + 1}")
        ax.set_xticks([x + 0.2 for x in range(len(systems))], [s.replace("_", "\n") for s in systems], fontsize=8)
        ax.set_ylabel("requests/s")
        ax.set_title(f"concurrency {load[1:]}")
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="baton bench serve", description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=500, help="requests at concurrency 8, per system and round")
    p.add_argument("--requests-c1", type=int, default=60, help="requests at concurrency 1")
    p.add_argument("--input-len", type=int, default=400)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--out", type=Path, help="also write the JSON here")
    p.add_argument("--plot", type=Path, help="bar chart of req/s per system and round (PNG)")
    p.add_argument("--speculation", choices=("ngram",), help="Baton's decode pool speculates with this method "
                   "(to measure what turning it on by default would cost)")
    args = p.parse_args(argv)
    systems = args.systems.split(",")
    if unknown := set(systems) - set(SYSTEMS + OPTIONAL):
        p.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS + OPTIONAL)}")
    # Each load its own seed, hence its own prompts (bench/common/vllm_load.py).
    loads = {"c8": vllm_load.Workload(args.requests, 8, args.input_len, args.output_len, seed=0),
             "c1": vllm_load.Workload(args.requests_c1, 1, args.input_len, args.output_len, seed=1)}
    workdir = bench_workdir("bench-serve")
    doc: dict = {"workload": {k: vars(w) for k, w in loads.items()}, "rounds": [],
                 **({"baton_speculation": args.speculation} if args.speculation else {})}
    for n in range(args.rounds):
        print(f"round {n + 1}/{args.rounds}", file=sys.stderr, flush=True)
        order = systems if n % 2 == 0 else systems[::-1]  # A B, then B A
        results = {s: measure(s, workdir / f"round{n + 1}", loads, args.speculation) for s in order}
        doc["rounds"].append({"results": results, "vs_vllm_serve": ratios(results, "vllm_serve"),
                              "vs_ray_serve_llm_fast": ratios(results, "ray_serve_llm_fast")})
    emit(doc, args.out, args.plot, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
