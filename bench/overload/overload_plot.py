"""The figure and the markdown table of a `baton bench overload` result.

Both read the JSON document `bench.overload.overload` writes:
``{"runs": {"<ingress replicas>": {"levels": {"<x>x": {...}}, ...}}, "command": [...]}``.
"""

from __future__ import annotations

from pathlib import Path

TENANTS = ("light", "heavy")
COLUMNS = ("ingress replicas", "offered x", "offered req/s", "goodput req/s", "goodput ratio",
           "light % fair", "heavy % fair", "429 (all with Retry-After?)", "5xx", "load generator CPU (cores)")


def _fmt(v, spec: str = "g", unit: str = "") -> str:
    return "–" if v is None else format(v, spec) + unit


def _levels(run: dict) -> list[dict]:
    return sorted(run["levels"].values(), key=lambda lv: lv["x"])


def _rejections(lv: dict) -> str:
    n = sum(t.get("rejected_429", t["status_codes"].get("429", 0)) for t in lv["tenants"].values())
    bare = sum(t["429_without_retry_after"] for t in lv["tenants"].values())
    if not n:
        return "0"
    return f"{n} (yes)" if not bare else f"{n} (no: {bare} without)"


def markdown_table(doc: dict) -> str:
    """One row per ingress count and level, in the order of ``COLUMNS``."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for n, run in sorted(doc["runs"].items(), key=lambda kv: int(kv[0])):
        for lv in _levels(run):
            t = lv["tenants"]
            row = [n, f"{lv['x']:g}×", _fmt(lv["offered_rps"], ".1f"), _fmt(lv["goodput_rps"], ".2f"),
                   _fmt(lv["goodput_ratio"], ".2f"), _fmt(t["light"]["pct_of_fair_share"], ".0f", "%"),
                   _fmt(t["heavy"]["pct_of_fair_share"], ".0f", "%"), _rejections(lv),
                   str(sum(v["5xx"] for v in t.values())), _fmt(lv.get("loadgen_cpu_cores"), ".2f")]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> None:
    """(a) goodput ratio and (b) each tenant's % of its max-min fair share,
    against offered load (multiples of capacity, log scale), per ingress count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (good, fair) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = {"light": "-", "heavy": "--"}
    for i, (n, run) in enumerate(sorted(doc["runs"].items(), key=lambda kv: int(kv[0]))):
        levels, color = _levels(run), colors[i % len(colors)]
        xs = [lv["x"] for lv in levels]
        ratio = [lv["goodput_ratio"] if lv["goodput_ratio"] is not None else float("nan") for lv in levels]
        good.plot(xs, ratio, "o-", color=color, label=f"{n} ingress")
        for tenant in TENANTS:
            pct = [lv["tenants"][tenant]["pct_of_fair_share"] for lv in levels]
            fair.plot(xs, [float("nan") if p is None else p for p in pct], marker="o", ls=styles[tenant],
                      color=color, label=f"{tenant}, {n} ingress")
    for y in (0.9, 0.8):
        good.axhline(y, color="grey", ls=":", lw=1)
    fair.axhline(90, color="grey", ls=":", lw=1)
    all_x = sorted({lv["x"] for run in doc["runs"].values() for lv in run["levels"].values()})
    for ax, title, ylabel in ((good, "(a) goodput vs goodput at 1×", "goodput ratio"),
                              (fair, "(b) successes vs max-min fair share", "% of fair share")):
        ax.set_xscale("log")
        ax.set_xticks(all_x, [f"{x:g}×" for x in all_x])
        ax.minorticks_off()
        ax.set_xlabel("offered load (× measured capacity)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    good.set_ylim(bottom=0)
    fair.set_ylim(bottom=0)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
