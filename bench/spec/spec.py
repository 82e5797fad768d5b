"""`baton bench spec`: speculative decoding on and off, same run, on the copying model.

Systems: a colocated stack and a disaggregated one (1 prefill + 1 decode),
each with speculation off and with each method (`ngram`, `draft`), one stack
at a time, all on the trained copying model of cluster/default_model/train_copy.py
(`models/baton-tiny-copy`, draft `models/baton-tiny-copy-draft`; trained
here first if missing, a few CPU minutes each, cached). Workloads:

- **tool-echo** at concurrency 1: held-out chats that carry a tool result
  (train_copy.heldout_prompts); the model answers by repeating it.
- **free text** at concurrency 8: corpus lines with an open question and no
  tool result.

Greedy, streamed, real answers (the model's own end, at most `--max-tokens`).
Per system and workload: TPOT p50/p99 (client-side: (end - first token) /
(tokens - 1)), TTFT p50, the share of answers identical to the same mode's
answers without speculation, and the acceptance counters' change in the
stack's /metrics (drafts, draft tokens, accepted; acceptance rate and mean
accepted length). Ratios against speculation off in the same mode. JSON on
stdout (and `--out`), a bar chart with `--plot`.

    python -m bench.spec.spec --out docs/results/spec/spec.json --plot docs/results/spec/spec.png
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path

import httpx

from bench.common.stack import StackProcess, bench_workdir, write_config
from common.constants import CORPUS, DEFAULT_MODEL_DIR, DRAFT_MODEL_DIR, EAGLE_MODEL_DIR, REPO_ROOT

MODEL, DRAFT, EAGLE = DEFAULT_MODEL_DIR, DRAFT_MODEL_DIR, EAGLE_MODEL_DIR
METHODS = {"off": None, "ngram": {"method": "ngram", "num_speculative_tokens": 4},
           "draft": {"method": "draft", "num_speculative_tokens": 4, "draft_model": str(DRAFT)},
           "eagle": {"method": "eagle", "num_speculative_tokens": 4, "draft_model": str(EAGLE)}}
QUESTIONS = ("What does this make you think of?", "Say something new about it.", "Continue the story.")
COUNTERS = ("drafts", "draft_tokens", "accepted_tokens")


def _log(msg: str) -> None:
    print(f"[bench spec] {msg}", file=sys.stderr, flush=True)


def workloads(n_echo: int, n_free: int) -> dict[str, tuple[int, list[list[dict]]]]:
    """name -> (concurrency, chats)."""
    from cluster.default_model.train_copy import heldout_prompts

    lines = [x for x in CORPUS.read_text().splitlines() if x.strip()]
    free = [[{"role": "user", "content": f"{lines[i % len(lines)]} {QUESTIONS[i % len(QUESTIONS)]}"}]
            for i in range(n_free)]
    return {"tool_echo": (1, [m for m, _ in heldout_prompts(n_echo)]), "free_text": (8, free)}


def ensure_models() -> None:
    """The copying model, its draft and its EAGLE head (committed; trained again only if their
    inputs changed)."""
    from cluster.default_model import ensure_default

    ensure_default(log=_log)


async def _one(client: httpx.AsyncClient, url: str, messages: list[dict], max_tokens: int,
               extra: dict | None = None) -> dict:
    body = {"model": "baton-tiny", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}
    t0, first, text, tokens = time.monotonic(), None, [], 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return {"error": r.status_code}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for c in chunk.get("choices") or []:
                if c["delta"].get("content"):
                    first = first or time.monotonic()
                    text.append(c["delta"]["content"])
    end = time.monotonic()
    tpot = (end - first) / (tokens - 1) if first and tokens > 1 else None
    return {"text": "".join(text), "tokens": tokens, "ttft": (first or end) - t0, "tpot": tpot}


async def _run(url: str, chats: list[list[dict]], concurrency: int, max_tokens: int,
               extra: dict | None = None) -> list[dict]:
    """Each chat once, `concurrency` at a time; `extra`: more fields of every request's body."""
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=300) as client:
        async def one(m):
            async with sem:
                return await _one(client, url, m, max_tokens, extra)
        return await asyncio.gather(*(one(m) for m in chats))


def _counters(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out = {}
    for name in COUNTERS:
        m = re.search(rf'^baton_spec_{name}_total\{{pool="decode"\}} (\S+)$', text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


def _pct(values: list[float], q: float) -> float | None:
    v = sorted(x for x in values if x is not None)
    return round(v[min(len(v) - 1, int(q * len(v)))] * 1000, 3) if v else None


def measure(url: str, loads: dict, max_tokens: int) -> dict:
    """Each workload through `url`: latency percentiles, the answers, the counters' change."""
    out = {}
    for name, (concurrency, chats) in loads.items():
        before = _counters(url)
        answers = asyncio.run(_run(url, chats, concurrency, max_tokens))
        after = _counters(url)
        d = {k: after[k] - before[k] for k in COUNTERS}
        out[name] = {"requests": len(answers), "errors": sum(1 for a in answers if "error" in a),
                     "tpot_p50_ms": _pct([a.get("tpot") for a in answers], 0.5),
                     "tpot_p99_ms": _pct([a.get("tpot") for a in answers], 0.99),
                     "ttft_p50_ms": _pct([a.get("ttft") for a in answers], 0.5),
                     "mean_tokens": round(sum(a.get("tokens", 0) for a in answers) / max(1, len(answers)), 1),
                     **acceptance(d), "answers": [a.get("text") for a in answers]}
    return out


def acceptance(d: dict[str, float]) -> dict:
    """The speculation counters' change `d` (drafts, draft_tokens, accepted_tokens), each as
    `spec_<name>`, with the acceptance rate and mean accepted length they give (None without drafts)."""
    return {**{f"spec_{k}": d[k] for k in COUNTERS},
            "acceptance_rate": round(d["accepted_tokens"] / d["draft_tokens"], 4) if d["draft_tokens"] else None,
            "mean_accepted_length": round(1 + d["accepted_tokens"] / d["drafts"], 3) if d["drafts"] else None}


def run_system(mode: str, method: str, workdir: Path, loads: dict, max_tokens: int) -> dict:
    decode = {"replicas": 1, **({"speculation": METHODS[method]} if METHODS[method] else {})}
    stack = StackProcess(write_config(workdir / f"{mode}-{method}", colocated=mode == "colocated",
                                      model={"path": str(MODEL)}, decode=decode, tracing={"exporter": "none"}))
    _log(f"{mode} / {method}: starting")
    t0 = time.monotonic()
    try:
        stack.start()
    except (RuntimeError, TimeoutError) as exc:
        _log(f"{mode} / {method}: did not start")
        return {"error": str(exc)[-2000:]}
    try:
        _log(f"{mode} / {method}: ready after {time.monotonic() - t0:.0f} s")
        return measure(stack.url, loads, max_tokens)
    finally:
        stack.stop()


def compare(results: dict, keys: tuple[str, ...] = ("tpot_p50_ms",)) -> None:
    """Adds, per system ((mode, method)) and workload, each of `keys` against the same mode without
    speculation (`<key less _ms>_vs_off`) and the share of answers identical to it; drops the answers."""
    for (mode, method), res in results.items():
        base = results.get((mode, "off"), {})
        for name, w in res.items():
            if not isinstance(w, dict) or not isinstance(base.get(name), dict):
                continue
            b = base[name]
            for key in keys:
                if w.get(key) and b.get(key):
                    w[key.removesuffix("_ms") + "_vs_off"] = round(w[key] / b[key], 3)
            pairs = list(zip(w.get("answers") or [], b.get("answers") or []))
            w["identical_to_off"] = round(sum(x == y for x, y in pairs) / max(1, len(pairs)), 4)
    for res in results.values():
        for w in res.values():
            if isinstance(w, dict):
                w.pop("answers", None)


def targets(results: dict) -> dict:
    """Issue 33's bars, from the colocated and disaggregated runs."""
    out: dict = {}
    echo = {m: results[("colocated", m)]["tool_echo"] for m in ("ngram", "draft", "eagle")
            if "tool_echo" in results.get(("colocated", m), {})}
    best = min((w.get("tpot_p50_vs_off", 9) for w in echo.values()), default=None)
    out["tool_echo_best_tpot_vs_off"] = best
    out["tool_echo_ok"] = best is not None and best <= 0.6
    out["tool_echo_identical_min"] = min((w.get("identical_to_off", 0) for w in echo.values()), default=None)
    out["identical_ok"] = (out["tool_echo_identical_min"] or 0) >= 0.99
    free = results.get(("colocated", "ngram"), {}).get("free_text", {})
    out["free_text_ngram_tpot_vs_off"] = free.get("tpot_p50_vs_off")
    out["free_text_ok"] = (free.get("tpot_p50_vs_off") or 9) <= 1.05
    for m in ("ngram", "draft", "eagle"):
        c = results.get(("colocated", m), {}).get("tool_echo", {}).get("acceptance_rate")
        d = results.get(("disaggregated", m), {}).get("tool_echo", {}).get("acceptance_rate")
        if c and d:
            out[f"disaggregated_{m}_acceptance_vs_colocated"] = round(d / c, 3)
            out[f"disaggregated_{m}_ok"] = abs(d / c - 1) <= 0.05
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="baton bench spec", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", nargs="+", default=["colocated", "disaggregated"])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--echo-requests", type=int, default=40)
    p.add_argument("--free-requests", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--out", type=Path)
    p.add_argument("--plot", type=Path)
    args = p.parse_args(argv)
    ensure_models()
    loads, workdir = workloads(args.echo_requests, args.free_requests), bench_workdir("bench-spec")
    results = {}
    for mode in args.modes:
        for method in ["off"] + [m for m in args.methods if m != "off"]:
            results[(mode, method)] = run_system(mode, method, workdir, loads, args.max_tokens)
            for name, w in results[(mode, method)].items():
                if isinstance(w, dict):
                    _log(f"  {name}: TPOT p50 {w['tpot_p50_ms']} ms, acceptance {w['acceptance_rate']}")
    compare(results)
    doc = {"model": str(MODEL.relative_to(REPO_ROOT)), "workloads": {k: {"concurrency": c, "requests": len(v)}
                                                                       for k, (c, v) in loads.items()},
           "max_tokens": args.max_tokens, "results": {f"{m}/{x}": r for (m, x), r in results.items()},
           "targets": targets(results)}
    if args.plot:
        from bench.spec.spec_plot import plot

        plot(doc, args.plot)
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
