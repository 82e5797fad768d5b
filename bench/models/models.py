"""`baton bench models`: many models on one replica, against one engine per model.

Two parts (`--parts`); every system runs alone on the machine, each on a fresh stack.
- wake: a catalogue stack with room for two of three models (min_resident_s 2) has woken
  `--model` once, then made the others resident; the timed streamed chat request for the
  now cold model (first body byte, first token, total; the engine start from
  baton_model_wake_seconds) against a fresh `vllm serve` of the same model and engine
  settings, timed from its process start to the first token of the same request.
  Rounds alternate the order. Ratio: Baton's TTFT / vllm serve's (target <= 0.25).
- overcommit: level L serves the first L x `--room` of MODELS (hottest first: the shipped
  five, then eight generated ones) in catalogue.memory_gb that holds their `--room` largest
  budgets (each ~0.26 GiB), so budgets add up to about L x memory_gb. A seeded Zipf mix of
  requests, closed loop, deadline header long enough to wait for swaps (429s counted, not
  retried). The baseline is each of the two hottest models on a single-model pool of its
  own (a one-model stack, alone on the machine), sent that model's requests of the same
  run at the times the overcommitted run sent them (open loop): the same model, the same
  arrivals, nothing shared. Each run starts after its stack's models (at most `--room`)
  answered once and `--warmup` requests of the same mix (unmeasured; a baseline: its
  model's share of them) gave residency the mix's demand. Reported: TTFT p50/p95 of the
  two hottest models, pooled and per model, and ratios to the baseline, errors, 429s,
  wakes and evictions (/metrics deltas), the usage counters' totals next to the usage the
  clients received.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from pathlib import Path

import httpx

from bench.models.models_plot import arm_stats, delta
from bench.models.models_stack import (FIRST, MODELS, answer_once, chat_body, generated, log, ratio, resident, scrape,
                                 stack_config)
from bench.common.stack import StackProcess, bench_workdir, write_config
from common.constants import CORPUS, DEADLINE_HEADER, DEFAULT_MODEL_DIR, REPO_ROOT


def level_models(level: int, room: int) -> list[str]:
    """The models overcommit `level` serves with room for `room`: the first level x room of MODELS."""
    n = level * room
    if level < 1 or room < 1 or n > len(MODELS):
        raise ValueError(f"overcommit {level} x room {room} needs {n} models; there are {len(MODELS)}")
    return MODELS[:n]


def zipf_mix(models: list[str], n: int, s: float, seed: int) -> list[str]:
    """`n` model ids drawn with weight 1 / rank**s (models hottest first); a pure function of its arguments."""
    return random.Random(seed).choices(models, weights=[1 / (i + 1) ** s for i in range(len(models))], k=n)


def budgets(ids: list[str]) -> dict[str, int]:
    """Each model's budget in bytes as the catalogue counts it (weights plus 0.25 GiB of KV cache)."""
    from common.config.models import CatalogueModel

    first = CatalogueModel(id=FIRST, path=str(DEFAULT_MODEL_DIR), kv_cache_gb=0.25)
    return {m.id: m.budget_bytes() for m in [first, *(CatalogueModel(**e) for e in generated(ids))]}


def room_gb(ids: list[str], room: int) -> float:
    """catalogue.memory_gb that holds any `room` of `ids` (their `room` largest budgets) and no more."""
    return math.ceil(sum(sorted(budgets(ids).values())[-room:]) / 2**30 * 1000) / 1000


async def drive(url: str, mix: list[tuple[str, dict]], concurrency: int, deadline_s: float,
                at: list[float] | None = None) -> list:
    """Sends every (model, body) of `mix`, streamed, at most `concurrency` at a time (closed loop);
    with `at`, each at its `at` seconds after the start instead, whatever is in flight (open loop).
    (model, RequestResult) each, in `mix`'s order, failures included (bench/load/load.py's stream reader)."""
    from bench.load.load import _stream
    from bench.common.loadgen import RequestResult

    width = concurrency if at is None else max(1, len(mix))
    sem, t0 = asyncio.Semaphore(width), time.perf_counter()

    async def one(client: httpx.AsyncClient, i: int, model: str, body: dict) -> tuple:
        result = RequestResult(index=i)
        if at is not None:
            await asyncio.sleep(max(0.0, t0 + at[i] - time.perf_counter()))
        async with sem:
            sent = time.perf_counter()
            result.sent_s = sent - t0
            try:
                await _stream(client, f"{url}/v1/chat/completions", {
                    **body, "model": model, "stream": True, "stream_options": {"include_usage": True}},
                    {DEADLINE_HEADER: str(deadline_s)}, result, sent)
            except Exception as exc:  # noqa: BLE001 - every failure is a result
                result.error = f"{type(exc).__name__}: {exc}"[:300].removeprefix("RuntimeError: ")
        return model, result

    limits = httpx.Limits(max_connections=width, max_keepalive_connections=width)
    async with httpx.AsyncClient(timeout=httpx.Timeout(deadline_s + 300, connect=10), limits=limits) as client:
        return list(await asyncio.gather(*(one(client, i, m, b) for i, (m, b) in enumerate(mix))))


# -- overcommit -------------------------------------------------------------------------


def one_model_config(workdir: Path, model: str) -> Path:
    """A colocated one-replica stack serving only `model`, no catalogue: a hot model's pool of its own."""
    from common.config.models import CatalogueModel

    if model == FIRST:
        path, kv_gb = DEFAULT_MODEL_DIR, 0.25
    else:
        entry = next(e for e in generated([model]) if e["id"] == model)
        path, kv_gb = CatalogueModel(**entry).resolved_path(), entry.get("kv_cache_gb", 0.25)
    return write_config(workdir, colocated=True, decode={"replicas": 1, "kv_cache_gb": kv_gb},
                        model={"path": str(path), "served_name": model}, tracing={"exporter": "none"})


def measure_arm(args, config: Path, first: list[str], hot: list[str], mix: list, label: str, warm: list,
                at: list[float] | None = None) -> tuple:
    """Starts the stack of `config`, has the models of `first` answer once, sends `warm` unmeasured
    (so residency has seen the mix's demand), then `mix` (at the times `at` when given, see `drive`),
    and stops it; (stats, rows)."""
    log(f"{label}: starting baton ...")
    stack = StackProcess(config)
    stack.start()
    try:
        for m in first:
            answer_once(stack.url, m)
        if warm:
            log(f"  {label}: {len(warm)} warm-up requests (not measured) ...")
            asyncio.run(drive(stack.url, warm, args.concurrency, args.deadline_s))
        at_start, before, t0 = resident(stack.url), scrape(stack.url), time.perf_counter()
        rows = asyncio.run(drive(stack.url, mix, args.concurrency, args.deadline_s, at))
        wall = time.perf_counter() - t0
        stats = arm_stats(rows, hot, delta(scrape(stack.url), before))
    finally:
        stack.stop()
    stats.update(resident_at_start=at_start, wall_s=round(wall, 2))
    log(f"  {label}: {json.dumps(stats)}")
    return stats, rows


def run_level(args, level: int, workdir: Path) -> dict:
    ids = level_models(level, args.room)
    hot = ids[:2]
    memory_gb, total_gb = room_gb(ids, args.room), sum(budgets(ids).values()) / 2**30
    rng, vocab = random.Random(args.seed + level), CORPUS.read_text().split()
    mix = [(m, chat_body(rng, args.prompt_words, args.max_tokens, vocab))
           for m in zipf_mix(ids, args.requests, args.zipf_s, args.seed + level)]
    warm = [(m, chat_body(rng, args.prompt_words, args.max_tokens, vocab))
            for m in zipf_mix(ids, args.warmup, args.zipf_s, args.seed + level + 1000)]
    reps: list[dict] = []
    pooled: dict[str, list] = {"overcommitted": [], "baseline": []}
    for rep in range(args.repeats):
        tag = f"(repeat {rep + 1}/{args.repeats})"
        over, rows = measure_arm(args, stack_config(workdir / f"overcommitted-{rep + 1}", ids, memory_gb,
                                                    args.min_resident_s), ids[:args.room], hot, mix,
                                 f"overcommit {level}x/overcommitted {tag}", warm)
        rep_out = {"overcommitted": over, "baseline_by_model": {}}
        base_rows: list = []
        for m in hot:  # each hot model alone, its requests at the times the overcommitted run sent them
            mine = [i for i, (model, _) in enumerate(mix) if model == m]
            stats, res = measure_arm(args, one_model_config(workdir / f"baseline-{m}-{rep + 1}", m), [m], hot,
                                     [mix[i] for i in mine], f"overcommit {level}x/{m} alone {tag}",
                                     [w for w in warm if w[0] == m], at=[rows[i][1].sent_s for i in mine])
            rep_out["baseline_by_model"][m] = stats
            base_rows += res
        rep_out["baseline"] = arm_stats(base_rows, hot)
        reps.append(rep_out)
        pooled["overcommitted"] += rows
        pooled["baseline"] += base_rows
    out = {"models": ids, "hot": hot, "memory_gb": memory_gb, "budgets_gb": round(total_gb, 3),
           "overcommit_actual": round(total_gb / memory_gb, 2), "repeats": reps}
    for arm in pooled:
        out[arm] = reps[0][arm] if args.repeats == 1 else arm_stats(pooled[arm], hot)
    a, b = out["overcommitted"], out["baseline"]
    out.update(ratio_p50=ratio(a["hot_ttft_p50_s"], b["hot_ttft_p50_s"]),
               ratio_p95=ratio(a["hot_ttft_p95_s"], b["hot_ttft_p95_s"]),
               ratio_p95_by_model={m: ratio(a["hot_by_model"][m]["ttft_p95_s"], b["hot_by_model"][m]["ttft_p95_s"])
                                   for m in hot if m in a["hot_by_model"] and m in b["hot_by_model"]},
               usage_equal=all(r["overcommitted"]["usage"]["equal"]
                               and all(s["usage"]["equal"] for s in r["baseline_by_model"].values()) for r in reps))
    return out


def run_overcommit(args, levels: list[int], workdir: Path) -> dict:
    return {"mapping": f"room for {args.room} models: level L serves the first L x {args.room} of {MODELS} (the "
                       f"first two the hottest; {args.warmup} unmeasured warm-up requests first) with "
                       f"catalogue.memory_gb the sum of their {args.room} largest budgets; baseline: each of the two "
                       "hottest models on a one-model stack of its own, sent its requests of the same run at the "
                       "times the overcommitted run sent them",
            "levels": {str(level): run_level(args, level, workdir / f"{level}x") for level in levels}}


def main(argv: list[str] | None = None) -> int:
    from bench.models.models_plot import plot, table

    p = argparse.ArgumentParser(prog="baton bench models", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="wake,overcommit", help="wake, overcommit or both")
    p.add_argument("--model", default="baton-small", help="the model the wake part wakes")
    p.add_argument("--wake-rounds", type=int, default=3)
    p.add_argument("--overcommit", default="1,2,4", help="overcommit levels (budgets over room)")
    p.add_argument("--room", type=int, default=3, help="models the overcommitted stacks hold at once")
    p.add_argument("--warmup", type=int, default=60, help="unmeasured requests of the same mix first")
    p.add_argument("--repeats", type=int, default=1, help="runs per level, each overcommitted then its baselines")
    p.add_argument("--requests", type=int, default=200, help="requests per run")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--zipf-s", type=float, default=1.1, help="Zipf exponent of the model mix")
    p.add_argument("--prompt-words", type=int, default=60)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--min-resident-s", type=float, default=5.0, help="catalogue.min_resident_s of overcommit runs")
    p.add_argument("--deadline-s", type=float, default=120.0, help="x-baton-deadline-s of overcommit requests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "results" / "models" / "models.json")
    p.add_argument("--plot", type=Path, help="also draw the result here (PNG)")
    args = p.parse_args(argv)
    parts = set(args.parts.split(","))
    if unknown := parts - {"wake", "overcommit"}:
        p.error(f"unknown parts {sorted(unknown)}")
    levels = [int(x) for x in args.overcommit.split(",") if x] if "overcommit" in parts else []
    for level in levels:
        try:
            level_models(level, args.room)
        except ValueError as exc:
            p.error(str(exc))
    workdir = bench_workdir("bench-models")
    doc: dict = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    if "wake" in parts and args.wake_rounds > 0:
        from bench.models.models_wake import run_wake

        doc["wake"] = run_wake(args, workdir / "wake")
    if levels:
        doc["overcommit"] = run_overcommit(args, levels, workdir / "overcommit")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(table(doc))
    if args.plot:
        plot(doc, args.plot)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
