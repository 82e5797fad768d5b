"""`baton bench ttft`: where one request's time to first token goes, per layout.

One streamed chat request at a time (`--requests`, the first `--warmup`
uncounted), each prompt new (`--words` corpus words shuffled per request, so
no prefix is shared), greedy, `--output` tokens. Three stacks, one after
the other, on the default model:

- `colocated`: one engine replica that computes and decodes;
- `pd`: 1 prefill + 1 decode replica, the first token streamed from the
  prefill engine (routing.prefill_first_token, the default);
- `pd_two_step`: the same with that off: the first token waits for the KV
  save, decode's load and its first step.

Per layout: client TTFT (p10/p50/p90), and from the stack's own records
(the file span exporter and the front's histograms) the median of each
hop: the front's render and route, when the prefill span starts after the
ingress span, the prefill engine's compute, when the decode span starts and
how long decode took to its first bytes (`kv_load`). Ratios are to
colocated in the same run.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import yaml

from bench.common.stack import StackProcess, bench_workdir, write_config
from common.constants import CORPUS
from common.stats import percentile

LAYOUTS = {
    "colocated": {"colocated": True},
    "pd": {"colocated": False},
    "pd_two_step": {"colocated": False, "routing": {"prefill_first_token": False}},
}
HISTOGRAMS = ("baton_render_seconds", "baton_route_seconds")


def _stream(url: str, words: list[str], output: int) -> tuple[float, str]:
    """Sends one streamed chat request; returns (seconds to the first content, answer id)."""
    body = {"model": "baton-tiny", "messages": [{"role": "user", "content": " ".join(words)}],
            "max_tokens": output, "temperature": 0, "stream": True, "ignore_eos": True}
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t0, first, rid = time.perf_counter(), None, ""
    with urllib.request.urlopen(req, timeout=120) as resp:
        for line in resp:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            rid = chunk.get("id", rid)
            if first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                first = time.perf_counter() - t0
    return first if first is not None else float("nan"), rid


def _histogram_means(url: str) -> dict[str, float]:
    """Mean of each front histogram in HISTOGRAMS, in ms, from /metrics."""
    sums: dict[str, float] = {}
    for line in urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode().splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name.removesuffix("_sum").removesuffix("_count") in HISTOGRAMS and not line.startswith("#"):
            sums[name] = sums.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return {h.removesuffix("_seconds") + "_ms": round(1000 * sums[h + "_sum"] / sums[h + "_count"], 2)
            for h in HISTOGRAMS if sums.get(h + "_count")}


def _ts(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _hops(trace_file: Path, ids: list[str]) -> dict[str, float]:
    """Median ms of each hop over the answers `ids`, from the span file."""
    by: dict[str, dict] = {}
    for line in trace_file.read_text().splitlines():
        span = json.loads(line)
        by.setdefault(span["attributes"].get("baton.request_id"), {})[span["name"]] = span
    rows: dict[str, list[float]] = {}
    for rid in ids:
        spans = by.get(rid, {})
        if "ingress" not in spans:
            continue
        start = _ts(spans["ingress"]["start_time"])
        for name in ("prefill", "decode", "kv_load"):
            if name in spans:
                rows.setdefault(f"{name}_starts_ms", []).append(1000 * (_ts(spans[name]["start_time"]) - start))
        if "kv_load" in spans:
            s = spans["kv_load"]
            rows.setdefault("decode_to_first_bytes_ms", []).append(1000 * (_ts(s["end_time"]) - _ts(s["start_time"])))
        if (compute := spans.get("prefill", {}).get("attributes", {}).get("baton.compute_s")) is not None:
            rows.setdefault("prefill_compute_ms", []).append(1000 * compute)
    return {k: round(percentile(v, 50), 2) for k, v in rows.items()}


def measure(layout: str, workdir: Path, args) -> dict:
    """Runs one layout's stack and its requests; returns its TTFT and hops."""
    config = write_config(workdir / layout, **LAYOUTS[layout])
    stack = StackProcess(config)
    print(f"  starting {layout} ...", file=sys.stderr, flush=True)
    stack.start()
    try:
        rng, vocab = random.Random(args.seed), CORPUS.read_text().split()
        ttfts, ids = [], []
        for i in range(args.requests):
            words = [f"r{args.seed}-{i}"] + rng.sample(vocab, min(args.words, len(vocab)))
            ttft, rid = _stream(stack.url, words, args.output)
            if i >= args.warmup:
                ttfts.append(ttft)
                ids.append(rid)
        out = {f"ttft_p{q}_ms": round(1000 * percentile(ttfts, q), 2) for q in (10, 50, 90)}
        out.update(_histogram_means(stack.url))
        time.sleep(2)  # each process appends its spans when they end
        out.update(_hops(Path(yaml.safe_load(config.read_text())["tracing"]["file"]), ids))
        print(f"    TTFT p50 {out['ttft_p50_ms']} ms", file=sys.stderr, flush=True)
        return out
    finally:
        stack.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="baton bench ttft", description=__doc__.split("\n")[0])
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--words", type=int, default=250, help="corpus words per prompt (about 400 tokens)")
    p.add_argument("--output", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    layouts = args.layouts.split(",")
    if unknown := set(layouts) - set(LAYOUTS):
        p.error(f"unknown layouts {sorted(unknown)}; choose from {', '.join(LAYOUTS)}")
    workdir = bench_workdir("bench-ttft")
    results = {layout: measure(layout, workdir, args) for layout in layouts}
    base = results.get("colocated", {}).get("ttft_p50_ms")
    doc = {"requests": args.requests - args.warmup, "words": args.words, "results": results,
           "ttft_p50_vs_colocated": {k: round(v["ttft_p50_ms"] / base, 3) for k, v in results.items()} if base else {}}
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0
