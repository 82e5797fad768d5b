"""`baton bench affinity`: where session-affinity routing pays, on the real stack.

Two layouts of the `bench` model (8 layers, 16 heads sharing 8 KV heads,
32 KiB of KV per token): `colocated`, 2 replicas that each prefill and
decode, routed among by the fronts (routing.colocated_router), and `pd`,
2 prefill + 2 decode replicas. KV caches are sized so that the two replicas
of a pool cannot hold every session's context (`--kv-gb` each; the sessions'
final contexts add up to more than twice that). Agent sessions start at
`--first-words` words (about 1k tokens) and grow by `--turn-words` a turn
(to about 2k), each turn resending the whole conversation with its
`x-session-affinity` header.

For each layout, two pool settings, one after the other:
- pool on: the Mooncake pool (1 GB) plus the spill tier; any engine that
  computes prompts (prefill, or colocated with `mooncake.colocated_pool`)
  loads a prefix another saved;
- pool off: colocated engines without a connector; PD with
  `mooncake.prefix_reuse: false` and a pool that only holds the transfers
  in flight (KV moves from prefill to decode and nowhere else). Either way
  only the replica that computed a context can reuse it.

On each stack, one run per routing policy, each with sessions of its own
(new text, so no run finds another's prefixes): `baton` (pins, exact prefix
index, load), then the peers `round_robin` and `least_loaded`. The policy is
the stack's config, so each policy is a stack of its own. Reported: TTFT of
turn 1 and of turns 2+, and the ratios to round robin measured on the same
layout and pool setting.

One run is 24 turns 2+ per policy, and round robin's own median moves by a
fifth between runs on a noisy machine. `--repeats N` runs the policies N
times in turn (a fresh stack and new sessions each time), pools every
repeat's requests for the statistics, keeps each repeat's own, and gives the
turn-2+ p50 ratio to round robin a bootstrap interval over the pooled turns.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path

from bench.load.load import run
from bench.common.loadgen import CHAT, RequestSpec
from bench.common.stack import StackProcess, bench_workdir, write_config
from common.constants import CORPUS, SESSION_HEADER
from common.stats import percentile

POLICIES = ("baton", "round_robin", "least_loaded")
POOLS = {
    "on": {"global_segment_size": "1GB", "spill": True},
    "off": {"global_segment_size": "256MB", "spill": False, "prefix_reuse": False},
}


def sessions(n: int, turns: int, first_words: int, turn_words: int, output_tokens: int,
             seed: int) -> list[RequestSpec]:
    """`n` agent sessions of `turns` turns; turn 0 carries `first_words` words, later turns
    `turn_words` more; the driver resends the conversation so far with each turn."""
    rng = random.Random(seed)
    vocab = CORPUS.read_text().split()
    specs: list[RequestSpec] = []
    for s in range(n):
        sid = f"affinity-{seed}-{s}"
        for t in range(turns):
            words = first_words if t == 0 else turn_words
            text = f"Session {seed}-{s} turn {t}. " + " ".join(rng.choice(vocab) for _ in range(words))
            specs.append(RequestSpec(
                index=len(specs), at_s=0.0, endpoint=CHAT,
                body={"messages": [{"role": "user", "content": text}], "max_tokens": output_tokens,
                      "temperature": 0, "ignore_eos": True},
                headers={SESSION_HEADER: sid}, session_id=sid, turn=t, chat_history=True,
                output_tokens=output_tokens))
    return specs


def _later_ttfts(results) -> list[float]:
    return [r.ttft_s for r in results if r.ok and r.turn > 0]


def turn_stats(results) -> dict:
    """TTFT of turn 1 and of turns 2+, and the cached share of turns 2+; changes nothing."""
    ok = [r for r in results if r.ok]
    first = [r.ttft_s for r in ok if r.turn == 0]
    later = _later_ttfts(ok)
    return {
        "requests_ok": len(ok), "errors": len(results) - len(ok),
        "ttft_turn1_p50_s": percentile(first, 50),
        "ttft_turn2plus_p50_s": percentile(later, 50),
        "ttft_turn2plus_p90_s": percentile(later, 90),
        "cached_share_turn2plus": round(sum(r.cached_tokens or 0 for r in ok if r.turn > 0)
                                        / max(1, sum(r.input_tokens or 0 for r in ok if r.turn > 0)), 3),
        "input_tokens_max": max((r.input_tokens or 0 for r in ok), default=0),
        # What failed, so that a run's errors can be told apart (a refusal, a timeout, a 5xx).
        "error_kinds": dict(Counter(r.error[:80] for r in results if not r.ok)),
    }


def median_ratio_interval(a: list[float], b: list[float], draws: int = 2000, seed: int = 0,
                          level: float = 0.9) -> tuple[float, float] | None:
    """A bootstrap interval (`level`, two-sided) for p50(a) / p50(b): both samples are
    resampled with replacement `draws` times. None when either is empty. Changes nothing."""
    if not a or not b:
        return None
    rng = random.Random(seed)
    ratios = sorted(percentile(rng.choices(a, k=len(a)), 50) / percentile(rng.choices(b, k=len(b)), 50)
                    for _ in range(draws))
    tail = (1.0 - level) / 2
    return (round(ratios[int(tail * (draws - 1))], 3), round(ratios[int((1 - tail) * (draws - 1))], 3))


def session_routes(results) -> dict:
    """Where turns 2+ went, from each answer's `baton` object: by route reason, how many stayed on
    the replicas of the session's previous turn, ran decode-only, and got the cached tokens the
    router predicted; and on which decode replica each session's first turn ran. Changes nothing."""
    prev: dict[str, dict] = {}
    out: Counter = Counter()
    for r in sorted((r for r in results if r.ok and r.baton), key=lambda r: (r.session_id or "", r.turn)):
        info, last = r.baton, prev.get(r.session_id or "")
        prev[r.session_id or ""] = info
        if r.turn == 0:  # where new sessions were placed: the balance every later turn starts from
            out[f"first_turns_on/{info.get('decode_replica')}"] += 1
            continue
        out["turns"] += 1
        out[f"reason/{info.get('route')}"] += 1
        out["decode_only"] += bool(info.get("decode_only"))
        if last is not None:
            for pool in ("prefill", "decode"):
                mine = info.get(f"{pool}_replica")
                if mine is not None and last.get(f"{pool}_replica") is not None:
                    out[f"{pool}/same_as_last_turn" if mine == last.get(f"{pool}_replica")
                        else f"{pool}/moved"] += 1
        if info.get("predicted_cached_tokens") is not None:
            out["predicted_exact"] += info["predicted_cached_tokens"] == r.cached_tokens
    return dict(sorted(out.items()))


def moves(results) -> dict:
    """The turns whose pin the router moved in some pool (`moved` in their `baton` object, or
    route `moved`): the pools, each one's predicted wait had it stayed and where it went
    (routing/policy/cost.py) against its measured TTFT, and how many paid for themselves (measured
    TTFT below the predicted stay). Changes nothing."""
    moved = [r for r in results if r.ok and r.turn > 0 and r.baton
             and (r.baton.get("moved") or r.baton.get("route") == "moved")]
    rows = [{"pools": r.baton.get("moved") or ["decode"], "stay_s": r.baton.get("stay_s"),
             "predicted_s": r.baton.get("predicted_s"), "ttft_s": round(r.ttft_s, 4)} for r in moved]
    priced = [x for x in rows if x["stay_s"] is not None]
    paid = sum(x["ttft_s"] < x["stay_s"] for x in priced)
    return {"moves": len(rows), "paid": paid, "paid_share": round(paid / len(priced), 3) if priced else None,
            "each": rows}


def routing_counts(metrics_text: str) -> dict:
    """The fronts' routing decisions by pool and reason, and session pins moved, from a
    /metrics page (`baton_route_decisions_total`, `baton_repins_total`); changes nothing."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Counter = Counter()
    for fam in text_string_to_metric_families(metrics_text):
        for s in fam.samples:
            if s.name not in ("baton_route_decisions_total", "baton_repins_total"):
                continue
            key = "/".join(s.labels[k] for k in ("pool", "reason") if k in s.labels)
            out[key if s.name == "baton_route_decisions_total" else f"{key}/repins"] += s.value
    return {k: int(v) for k, v in sorted(out.items())}


def _fetch_routing_counts(url: str) -> dict:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:  # noqa: S310 - loopback
            return routing_counts(resp.read().decode())
    except OSError as exc:
        return {"unavailable": str(exc)[:80]}


def _config(workdir: Path, model: Path, args, layout: str, pool: str, policy: str, rep: int = 0) -> Path:
    pools = {"replicas": 2, "kv_cache_gb": args.kv_gb, "env": dict(kv.split("=", 1) for kv in args.engine_env),
             "engine_args": {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in args.engine_arg)}}
    mooncake = dict(POOLS[pool], shm_reads=not args.no_shm)
    if layout == "colocated":
        mooncake["colocated_pool"] = pool == "on"
        shape = {"colocated": True}
    else:
        shape = {"colocated": False, "prefill": pools}
    name = f"{layout}-pool-{pool}-{policy}" + (f"-{rep + 1}" if rep else "")  # a fresh state dir each
    return write_config(workdir / name, model={"path": str(model)},
                        decode=pools, mooncake=mooncake, **shape,
                        routing={"policy": policy, "decode_only_max_uncached_tokens": args.decode_only_max},
                        tracing={"exporter": "none"})


def _measure(config: Path, args, seed: int, label: str) -> tuple[dict, list]:
    """Starts a stack from `config`, runs one set of sessions through it, stops it. Returns
    the run's statistics and its requests' results."""
    stack = StackProcess(config)
    print(f"{label}: starting baton ...", file=sys.stderr, flush=True)
    stack.start()
    try:
        specs = sessions(args.sessions, args.turns, args.first_words, args.turn_words,
                         args.output_tokens, seed=seed)
        results, _ = run(stack.url, specs, concurrency=args.concurrency, label=label, timeout_s=600)
        routing = _fetch_routing_counts(stack.url)  # why requests went where they went
    finally:
        stack.stop()
    stats = {**turn_stats(results), "routing": routing, "turn2plus_routes": session_routes(results),
             "moves": moves(results)}
    print(json.dumps({"run": label, **stats}), file=sys.stderr, flush=True)
    return stats, results


def _append_requests(path: Path, results, **labels) -> None:
    """Appends one JSON line per request of `results` to `path`, with `labels` (its run)."""
    from dataclasses import asdict

    with path.open("a") as f:
        for r in results:
            f.write(json.dumps({**labels, **asdict(r)}) + "\n")


def _pool_runs(policies: list[str], per_repeat: list[dict], results: dict[str, list]) -> dict:
    """One pool setting's report: each policy's statistics over all its repeats (with each
    repeat's own under `repeats` when there are several), and the ratios to round robin."""
    runs: dict = {}
    for policy in policies:
        if len(per_repeat) == 1:
            runs[policy] = dict(per_repeat[0][policy])
            continue
        runs[policy] = {**turn_stats(results[policy]), "turn2plus_routes": session_routes(results[policy]),
                        "moves": moves(results[policy]), "repeats": [rep[policy] for rep in per_repeat]}
    rr = runs.get("round_robin")
    if rr:
        keys = ("ttft_turn1_p50_s", "ttft_turn2plus_p50_s", "ttft_turn2plus_p90_s")
        runs["ratio_to_round_robin"] = {
            p: {k: round(r[k] / rr[k], 3) for k in keys if r[k] and rr[k]}
            for p, r in runs.items() if p in POLICIES and p != "round_robin"}
        if len(per_repeat) > 1:
            for p, ratios in runs["ratio_to_round_robin"].items():
                ratios["turn2plus_p50_interval_90"] = median_ratio_interval(
                    _later_ttfts(results[p]), _later_ttfts(results["round_robin"]))
                ratios["turn2plus_p50_by_repeat"] = [
                    round(rep[p]["ttft_turn2plus_p50_s"] / rep["round_robin"]["ttft_turn2plus_p50_s"], 3)
                    for rep in per_repeat
                    if rep[p]["ttft_turn2plus_p50_s"] and rep["round_robin"]["ttft_turn2plus_p50_s"]]
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baton bench affinity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--first-words", type=int, default=700, help="words of turn 1 (~1k tokens)")
    parser.add_argument("--turn-words", type=int, default=160, help="words each later turn adds")
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--kv-gb", type=float, default=0.2, help="KV cache of each engine, GiB")
    parser.add_argument("--decode-only-max", type=int, default=64,
                        help="routing.decode_only_max_uncached_tokens: a decode replica that lacks fewer "
                        "prompt tokens than this computes them itself, skipping the prefill hop")
    parser.add_argument("--layouts", default="colocated,pd", help="layouts to run: colocated, pd or both")
    parser.add_argument("--pools", default="off,on", help="pool settings to run: off, on or both")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--no-shm", action="store_true",
                        help="mooncake.shm_reads off: engines move KV over the transfer engine's TCP only")
    parser.add_argument("--engine-env", action="append", default=[], metavar="KEY=VALUE",
                        help="environment of every engine process (repeatable)")
    parser.add_argument("--engine-arg", action="append", default=[], metavar="KEY=JSON",
                        help="a vLLM engine argument of every engine, its value as JSON (repeatable)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run the policies this many times in turn and pool the requests")
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    parser.add_argument("--requests", type=Path,
                        help="also write every request's result here, one JSON object a line")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    from bench.kv.kv import MODELS
    from cluster.default_model import tiny_model

    model = MODELS / "bench-llama"
    print(f"model {model} ...", file=sys.stderr, flush=True)
    tiny_model.generate(model, size="bench")
    workdir = bench_workdir("bench-affinity")
    if args.requests:
        args.requests.write_text("")
    out: dict = {"workload": {k: v for k, v in vars(args).items() if k not in ("out", "requests")}}
    for layout in args.layouts.split(","):
        for pool in args.pools.split(","):
            policies = args.policies.split(",")
            per_repeat: list[dict] = []
            results: dict[str, list] = {p: [] for p in policies}
            for rep in range(args.repeats):  # the policies in turn (A B, then B A): drift touches each alike
                per_repeat.append({})
                for i, policy in enumerate(policies if rep % 2 == 0 else policies[::-1]):
                    tag = f" (repeat {rep + 1}/{args.repeats})" if args.repeats > 1 else ""
                    per_repeat[-1][policy], res = _measure(
                        _config(workdir, model, args, layout, pool, policy, rep), args,
                        rep * len(policies) + i, f"{layout}/pool {pool}/{policy}{tag}")
                    results[policy] += res
                    if args.requests:
                        _append_requests(args.requests, res, layout=layout, pool=pool, policy=policy, repeat=rep)
            out.setdefault(layout, {})[f"pool_{pool}"] = _pool_runs(policies, per_repeat, results)
    print(json.dumps(out))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
