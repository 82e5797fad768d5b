"""Trace-driven router benchmark.

Replays the Mooncake conversation trace through Baton and baseline routers
over a simulated pool (see ``simulator``) and prints one JSON line: the
block-weighted prefix hit ratio of each policy, two reference bounds
(``pooled_bound``: one LRU with the pool's total capacity; ``unbounded``),
the work imbalance (max/mean of uncached prefill blocks + output tokens/512
per replica) and Baton's decision latency.

    python -m bench.router.router                 # 8 replicas x 2000 blocks
    python -m bench.router.router --sweep --plot docs/results/router/router_sweep.png
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from common.constants import REPO_ROOT, TRACE
from common.stats import percentile
from routing.policy.baselines import GreedyCapped, LeastLoaded, RoundRobin, TextPrefixTree
from routing.policy.baton_router import BatonRouter
from routing.policy.contracts import Router
from routing.sim.simulator import PoolEvent, ServiceModel, SimResult, simulate, single_cache_hit_ratio
from routing.sim.trace import TraceRequest, conversation_session, load_trace

SWEEP_CAPACITIES = (500, 1000, 2000, 4000, 8000)
POLICIES = ("baton", "round_robin", "least_loaded", "text_prefix_tree", "greedy_capped")


class _Progress:
    """Percent done on stderr, at most every ``every_s`` seconds."""

    def __init__(self, label: str, every_s: float = 2.0) -> None:
        self.label = label
        self.every_s = every_s
        self._last = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        t = time.monotonic()
        if t - self._last >= self.every_s or done == total:
            self._last = t
            print(f"[bench_router] {self.label}: {100 * done // max(total, 1)}%", file=sys.stderr, flush=True)


def make_router(policy: str, capacity: int, seed: int) -> Router:
    """A fresh router named ``policy``; randomised ones get their own seeded RNG."""
    if policy == "baton":
        return BatonRouter(rng=random.Random(seed))
    if policy == "round_robin":
        return RoundRobin()
    if policy == "least_loaded":
        return LeastLoaded()
    if policy == "text_prefix_tree":
        return TextPrefixTree(tenant_capacity=capacity, rng=random.Random(seed))
    if policy == "greedy_capped":
        return GreedyCapped()
    raise ValueError(f"unknown policy {policy!r}")


def churn_events(trace: list[TraceRequest], replicas: int) -> list[PoolEvent]:
    """Replica r0 dies a third of the way through; a new replica joins halfway."""
    t0, t1 = trace[0].arrival_s, trace[-1].arrival_s
    return [
        PoolEvent(t0 + (t1 - t0) / 3, "remove", "r0"),
        PoolEvent(t0 + (t1 - t0) / 2, "add", f"r{replicas}"),
    ]


def run_capacity(
    trace: list[TraceRequest],
    replicas: int,
    capacity: int,
    seed: int,
    model: ServiceModel,
    events: list[PoolEvent] | None = None,
) -> dict:
    """All policies and bounds at one capacity; returns the JSON-ready summary."""
    events = events or []
    results: dict[str, SimResult] = {}
    for policy in POLICIES:
        router = make_router(policy, capacity, seed)
        results[policy] = simulate(
            trace,
            router,
            replicas,
            capacity,
            model,
            progress=_Progress(f"{policy} cap={capacity}"),
            pool_events=events,
        )
    sessions = simulate(
        trace,
        make_router("baton", capacity, seed),
        replicas,
        capacity,
        model,
        session_of=lambda i, r: conversation_session(r),
        progress=_Progress(f"baton_sessions cap={capacity}"),
        pool_events=events,
    )
    pooled = single_cache_hit_ratio(trace, replicas * capacity)
    unbounded = single_cache_hit_ratio(trace, None)
    hit = {p: r.hit_ratio for p, r in results.items()}
    hit["baton_sessions"] = sessions.hit_ratio
    hit["pooled_bound"] = pooled
    hit["unbounded"] = unbounded
    imbalance = {p: r.imbalance for p, r in results.items()}
    imbalance["baton_sessions"] = sessions.imbalance
    lat = results["baton"].latencies_us
    summary = {
        "requests": len(trace),
        "replicas": replicas,
        "capacity": capacity,
        "hit_ratio": {k: round(v, 4) for k, v in hit.items()},
        "pct_of_pooled": {k: round(100 * v / pooled, 1) if pooled else None for k, v in hit.items()},
        "imbalance": {k: round(v, 3) for k, v in imbalance.items()},
        "baton_latency_us": {"p50": round(percentile(lat, 50) or 0.0, 1), "p99": round(percentile(lat, 99) or 0.0, 1)},
        "baton_reasons": dict(results["baton"].reasons),
        "baton_sessions_repins": sessions.repins,
    }
    if events:
        new = events[-1].replica
        summary["new_replica_work_share"] = {
            p: round(r.work.get(new, 0.0) / (sum(r.work.values()) or 1.0), 4) for p, r in results.items()
        }
    return summary


def plot_sweep(rows: list[dict], path: Path) -> None:
    """Hit ratio, % of the pooled bound and imbalance vs capacity, per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caps = [r["capacity"] for r in rows]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.8))
    for key in (*POLICIES, "baton_sessions", "pooled_bound", "unbounded"):
        style = "--" if key in ("pooled_bound", "unbounded") else "-o"
        ax1.plot(caps, [r["hit_ratio"][key] for r in rows], style, label=key, markersize=4)
        if key != "unbounded":
            ax2.plot(caps, [r["pct_of_pooled"][key] for r in rows], style, label=key, markersize=4)
        if key in rows[0]["imbalance"]:
            ax3.plot(caps, [r["imbalance"][key] for r in rows], "-o", label=key, markersize=4)
    titles = ("block hit ratio", "% of pooled bound (zoom)", "work imbalance (max/mean)")
    for ax, title in zip((ax1, ax2, ax3), titles):
        ax.set_xscale("log", base=2)
        ax.set_xticks(caps, [str(c) for c in caps])
        ax.set_xlabel(f"KV capacity per replica (trace blocks), {rows[0]['replicas']} replicas")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax2.set_ylim(80, 105)
    ax2.axhline(97, color="grey", linewidth=0.8, linestyle=":")
    ax3.axhline(1.15, color="grey", linewidth=0.8, linestyle=":")
    ax1.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=TRACE, help="Mooncake trace (.jsonl)")
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    parser.add_argument("--replicas", type=int, default=8, help="simulated replicas in the pool")
    parser.add_argument("--capacity", type=int, default=2000, help="KV capacity per replica, trace blocks")
    parser.add_argument(
        "--prefill-blocks-per-s",
        type=float,
        default=ServiceModel.prefill_blocks_per_s,
        help="prefill speed of one replica; lower = more load (10: prefill ~75%% busy under Baton)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the routers' RNGs")
    parser.add_argument("--sweep", action="store_true", help=f"run capacities {SWEEP_CAPACITIES} and plot")
    parser.add_argument("--plot", type=Path, default=None, help="where to write the plot (PNG)")
    parser.add_argument("--churn", action="store_true", help="kill r0 at 1/3 of the trace and add a new replica at 1/2")
    args = parser.parse_args(argv)

    started = time.monotonic()
    trace = load_trace(args.trace, limit=args.limit)
    model = ServiceModel(prefill_blocks_per_s=args.prefill_blocks_per_s)
    events = churn_events(trace, args.replicas) if args.churn and trace else None
    if args.sweep:
        rows = [run_capacity(trace, args.replicas, c, args.seed, model, events) for c in SWEEP_CAPACITIES]
        plot_path = args.plot or REPO_ROOT / "docs/results/router/router_sweep.png"
        plot_sweep(rows, plot_path)
        out = {"trace": str(args.trace), "sweep": rows, "plot": str(plot_path)}
    else:
        out = {"trace": str(args.trace), **run_capacity(trace, args.replicas, args.capacity, args.seed, model, events)}
        if args.plot is not None:
            plot_sweep([out], args.plot)
            out["plot"] = str(args.plot)
    out["elapsed_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
