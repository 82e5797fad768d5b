"""What `baton bench models` (bench/models/models.py) reports: statistics of a run's requests and of
/metrics deltas, the printed table and the plot. Pure but for the plot's file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from common.stats import percentile

USAGE_KINDS = ("prompt", "completion", "cached")


def metric_totals(text: str) -> dict[tuple, float]:
    """Wakes, wake seconds (sum, count), evictions and usage tokens (summed over tenants) from a
    /metrics page, keyed ("wakes", model), ("wake_s_sum"|"wake_s_count", model), ("evictions",
    model, why), ("usage", model, kind)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Counter = Counter()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            lab = s.labels
            if s.name == "baton_model_wakes_total":
                out[("wakes", lab["model"])] += s.value
            elif s.name in ("baton_model_wake_seconds_sum", "baton_model_wake_seconds_count"):
                out[("wake_s_" + s.name.rsplit("_", 1)[1], lab["model"])] += s.value
            elif s.name == "baton_model_evictions_total":
                out[("evictions", lab["model"], lab["why"])] += s.value
            elif s.name == "baton_usage_tokens_total":
                out[("usage", lab["model"], lab["kind"])] += s.value
    return dict(out)


def delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def usage_check(server: dict, rows: list) -> dict:
    """Tokens by kind: the usage counters' delta (`server`, from `delta`) next to the sums of the usage
    the clients received in `rows` ((model, RequestResult)); `equal` when they agree per model and kind."""
    client: Counter = Counter()
    for model, r in rows:
        if r.ok:
            client[(model, "prompt")] += r.input_tokens
            client[(model, "completion")] += r.output_tokens
            client[(model, "cached")] += r.cached_tokens
    counted = Counter({(k[1], k[2]): int(v) for k, v in server.items() if k[0] == "usage"})
    return {"counters": {k: sum(v for (_, kk), v in counted.items() if kk == k) for k in USAGE_KINDS},
            "clients": {k: sum(v for (_, kk), v in client.items() if kk == k) for k in USAGE_KINDS},
            "equal": +counted == +client}


def arm_stats(rows: list, hot: list[str], metrics: dict | None = None) -> dict:
    """One run's (or pooled runs') statistics: TTFT of the hot models' and of all answered requests,
    failures by kind; with `metrics` (a /metrics delta) also wakes, evictions and the usage check."""
    ok = [(m, r) for m, r in rows if r.ok]
    hot_ttft = [r.ttft_s for m, r in ok if m in hot]
    every = [r.ttft_s for _, r in ok]
    out = {"requests": len(rows), "ok": len(ok), "by_model": dict(Counter(m for m, _ in rows)),
           "hot_ttft_p50_s": rounded(percentile(hot_ttft, 50)), "hot_ttft_p95_s": rounded(percentile(hot_ttft, 95)),
           "hot_by_model": {m: {"n": len(t), "ttft_p50_s": rounded(percentile(t, 50)),
                                "ttft_p95_s": rounded(percentile(t, 95))}
                            for m in hot if (t := [r.ttft_s for mm, r in ok if mm == m])},
           "all_ttft_p50_s": rounded(percentile(every, 50)), "all_ttft_p95_s": rounded(percentile(every, 95)),
           "rejected_429": sum(1 for _, r in rows if not r.ok and r.error.startswith("HTTP 429")),
           "errors": sum(1 for _, r in rows if not r.ok and not r.error.startswith("HTTP 429")),
           "error_kinds": dict(Counter(r.error[:80] for _, r in rows if not r.ok))}
    if metrics is not None:
        wake_n = sum(v for k, v in metrics.items() if k[0] == "wake_s_count")
        out.update(wakes=int(sum(v for k, v in metrics.items() if k[0] == "wakes")),
                   evictions=int(sum(v for k, v in metrics.items() if k[0] == "evictions")),
                   wake_s_mean=rounded(sum(v for k, v in metrics.items() if k[0] == "wake_s_sum") / wake_n)
                   if wake_n else None, usage=usage_check(metrics, rows))
    return out


def rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def table(doc: dict) -> str:
    """The short printed summary of a result document."""
    lines = []
    if w := doc.get("wake"):
        lines.append(f"wake {w['model']}: baton TTFT / vllm serve start-to-first-token (target <= {w['target_ratio']})")
        for i, r in enumerate(w["rounds"]):
            lines.append(f"  round {i + 1}: baton {r['baton']['ttft_s']:.2f}s (engine start "
                         f"{r['baton']['wake_engine_s']}s)  vllm serve {r['vllm_serve']['ttft_s']:.2f}s  "
                         f"ratio {r['ratio']}")
        lines.append(f"  median ratio {w['median_ratio']}")
    if o := doc.get("overcommit"):
        lines.append("overcommit  hot TTFT p50 / p95 (s)   vs each alone   429  err  wakes  evict  usage equal")
        for level, v in o["levels"].items():
            a, b = v["overcommitted"], v["baseline"]
            lines.append(f"  {level:>3}x  {a['hot_ttft_p50_s']} / {a['hot_ttft_p95_s']}  (base {b['hot_ttft_p50_s']}"
                         f" / {b['hot_ttft_p95_s']})  {v['ratio_p50']} / {v['ratio_p95']}  {a['rejected_429']}  "
                         f"{a['errors']}  {a.get('wakes')}  {a.get('evictions')}  {v['usage_equal']}")
            if v.get("ratio_p95_by_model"):
                lines.append("        p95 ratio by model: " + ", ".join(
                    f"{m} {r}" for m, r in v["ratio_p95_by_model"].items()))
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> None:
    """Wake: Baton's cold-model TTFT next to vllm serve's start to first token, per round; overcommit:
    the hot models' TTFT p50 and p95 per level, overcommitted and each on a pool of its own."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = [k for k in ("wake", "overcommit") if k in doc]
    fig, axes = plt.subplots(1, len(parts), figsize=(5.5 * len(parts), 4), squeeze=False)
    for ax, part in zip(axes[0], parts):
        if part == "wake":
            rounds = doc["wake"]["rounds"]
            xs = range(len(rounds))
            ax.bar([x - 0.2 for x in xs], [r["baton"]["ttft_s"] for r in rounds], 0.4, label="baton wake")
            ax.bar([x + 0.2 for x in xs], [r["vllm_serve"]["ttft_s"] for r in rounds], 0.4, label="vllm serve start")
            ax.set_xticks(list(xs), [f"round {x + 1}" for x in xs])
            ax.set_ylabel("seconds to first token")
            ax.set_title(f"cold {doc['wake']['model']}")
        else:
            levels = doc["overcommit"]["levels"]
            xs = range(len(levels))
            for i, (arm, q) in enumerate((a, q) for a in ("baseline", "overcommitted") for q in ("p50", "p95")):
                ax.bar([x - 0.3 + 0.2 * i for x in xs], [v[arm][f"hot_ttft_{q}_s"] or float("nan") for v in levels.values()],
                       0.2, label=f"{'each alone' if arm == 'baseline' else arm} {q}")
            ax.set_xticks(list(xs), [f"{k}x" for k in levels])
            ax.set_yscale("log")  # waits behind a swap are seconds, resident TTFTs tens of ms
            ax.set_ylabel("TTFT of the two hottest models (s)")
            ax.set_title("overcommit")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
