"""Speculative decoding on one GPU (issue 33): `vllm serve` of the copying model with each method, side by side.

    python -m bench.spec.spec_gpu OUT_DIR [--methods off ngram ngram_gpu draft eagle] [--graphs] [--cpu]

The device machines lent to sessions have a GPU and no network, so only
vLLM and its Python dependencies travel there (bench/common/gpu_payload.py), not
Ray or the rest of the stack: each method is a fresh `vllm serve` of
`models/baton-tiny-copy` on Baton's engine settings (bench/common/peers.py), one at
a time, with `--speculative-config` as Baton's `decode.speculation` would
pass it. Eager mode (no CUDA graphs), as `baton bench serve` runs the peers,
unless `--graphs`.

Workloads (greedy, streamed): **tool-echo** at concurrency 1 and **free text**
at concurrency 8, the held-out chats of `baton bench spec`; and **random**
at concurrency 8: 300 random corpus words and 64 tokens out (`ignore_eos`),
meant to have little to look up, to show what a method costs when it cannot
pay (the tiny model's answers repeat themselves, so n-gram still finds some).
Per method and workload: TPOT (the engine's own mean; the client's p50
beside it), tokens/s, answers identical to `off`, vLLM's own speculation
counters (`vllm:spec_decode_*`), and whether vLLM kept async scheduling (its
start-up warning when it turns it off). Writes OUT_DIR/spec_gpu.json as it goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

import httpx

from bench.models.sleep_gpu import ENGINE_ARGS, log
from bench.spec.spec import METHODS, MODEL, _pct, _run, acceptance, compare, workloads
from common.config.spec import SpeculationConfig

# `baton bench spec`'s methods as Baton's config passes them to vLLM (common/config/spec.py): `ngram` as on
# a CPU (the lookup on the CPU), `ngram_gpu` as Baton's `ngram` on a CUDA GPU.
SPEC = {"off": None, **{m: SpeculationConfig(**METHODS[m]).vllm() for m in ("ngram", "draft", "eagle")},
        "ngram_gpu": SpeculationConfig(**METHODS["ngram"]).vllm(gpu=True)}
COUNTERS = {"drafts": "vllm:spec_decode_num_drafts_total", "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
            "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
            # the engine's own per-request TPOT (its decode time / (tokens - 1)): vllm serve's stream may
            # deliver several tokens in one chunk when its server lags, which skews a client-side TPOT
            "tpot_sum": "vllm:request_time_per_output_token_seconds_sum",
            "tpot_count": "vllm:request_time_per_output_token_seconds_count"}
RANDOM_WORDS, RANDOM_OUT = 300, 64


def random_chats(n: int, seed: int = 7) -> list[list[dict]]:
    from common.constants import CORPUS

    words, rng = CORPUS.read_text().split(), random.Random(seed)
    return [[{"role": "user", "content": " ".join(rng.choice(words) for _ in range(RANDOM_WORDS))}] for _ in range(n)]


def counters(url: str) -> dict[str, float]:
    """vLLM's speculation counters and TPOT histogram's sum and count, summed over their labels."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = dict.fromkeys(COUNTERS, 0.0)
    names = {v: k for k, v in COUNTERS.items()}
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for s in fam.samples:
            if s.name in names:
                totals[names[s.name]] += s.value
    return totals


def measure(url: str, loads: dict, max_tokens: int) -> dict:
    """Each workload through `url` in turn: its figures, the counters' change and the answers."""
    out = {}
    for name, (concurrency, chats) in loads.items():
        before = counters(url)
        t0 = time.monotonic()
        extra, limit = ({"ignore_eos": True}, RANDOM_OUT) if name == "random" else (None, max_tokens)
        answers = asyncio.run(_run(url, chats, concurrency, limit, extra))
        took = time.monotonic() - t0
        d = {k: v - before[k] for k, v in counters(url).items()}
        tokens = sum(a.get("tokens", 0) for a in answers)
        out[name] = {"requests": len(answers), "errors": sum(1 for a in answers if "error" in a),
                     "tpot_mean_ms": round(1000 * d["tpot_sum"] / d["tpot_count"], 3) if d["tpot_count"] else None,
                     "client_tpot_p50_ms": _pct([a.get("tpot") for a in answers], 0.5),
                     "ttft_p50_ms": _pct([a.get("ttft") for a in answers], 0.5),
                     "output_tokens_per_s": round(tokens / took, 1), "mean_tokens": round(tokens / len(answers), 1),
                     **acceptance(d), "answers": [a.get("text") for a in answers]}
        log(f"  {name}: TPOT mean {out[name]['tpot_mean_ms']} ms, acceptance {out[name]['acceptance_rate']}")
    return out


def run_method(method: str, cfg, outdir: Path, loads: dict, max_tokens: int, gpu: bool, graphs: bool = False) -> dict:
    from bench.models.models_wake import started_fast
    from bench.common.peers import VllmServe

    server = VllmServe(cfg, outdir / f"vllm_{method}.log", timeout_s=300)
    if gpu:
        server.argv += ["--gpu-memory-utilization", str(ENGINE_ARGS["gpu_memory_utilization"]),
                        "--attention-backend", ENGINE_ARGS["attention_backend"]]
    if graphs:  # torch.compile and CUDA graphs, vLLM's default on a GPU
        server.argv.remove("--enforce-eager")
    if SPEC[method]:
        server.argv += ["--speculative-config", json.dumps(SPEC[method])]
    t0 = time.monotonic()
    try:
        with started_fast(server):
            res = {"start_s": round(time.monotonic() - t0, 1), **measure(server.url, loads, max_tokens)}
    except (RuntimeError, httpx.HTTPError) as exc:
        res = {"error": repr(exc)}
    logtext = server.log.read_text(errors="replace") if server.log.exists() else ""
    res["async_scheduling_off"] = "Async scheduling not supported" in logtext
    res["log_tail"] = [x for x in logtext.splitlines() if "WARNING" in x or "ERROR" in x or "Error" in x][-12:]
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--methods", nargs="+", default=list(SPEC), choices=list(SPEC))
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--cpu", action="store_true", help="a dry run on CPU: no GPU engine arguments")
    p.add_argument("--graphs", action="store_true", help="compiled, with CUDA graphs (default: eager)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    import yaml

    from common.config import load_config

    cfg_path = args.out / "spec_gpu.yaml"
    cfg_path.write_text(yaml.safe_dump({"colocated": True, "model": {"path": str(MODEL)},
                                        "decode": {"replicas": 1, "kv_cache_gb": 1.0}}))
    cfg = load_config(cfg_path)
    loads = {**workloads(40, 64), "random": (8, random_chats(64))}
    doc: dict = {"model": str(MODEL), "max_tokens": args.max_tokens, "eager": not args.graphs, "results": {}}
    for method in ["off"] + [m for m in args.methods if m != "off"]:
        log(f"{method}: starting vllm serve")
        doc["results"][method] = run_method(method, cfg, args.out, loads, args.max_tokens, not args.cpu, args.graphs)
        log(f"{method}: done ({doc['results'][method].get('error', 'ok')})")
        (args.out / "spec_gpu_raw.json").write_text(json.dumps(doc))
    compare({("gpu", m): r for m, r in doc["results"].items()}, keys=("tpot_mean_ms", "output_tokens_per_s"))
    (args.out / "spec_gpu.json").write_text(json.dumps(doc, indent=1))
    log(json.dumps({m: {w: (r[w].get("tpot_mean_vs_off"), r[w].get("acceptance_rate"), r[w].get("identical_to_off"))
                        for w in ("tool_echo", "free_text", "random") if isinstance(r.get(w), dict)}
                    for m, r in doc["results"].items()}))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    sys.exit(main())
