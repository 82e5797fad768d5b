"""Plots of `baton bench autoscale`: load and replicas over time, one row per trace.

Each row: the trace's request rate (right axis, grey), and per policy the
replicas of both pools together (prefill + decode targets, left axis), with
the TTFT-SLO misses of each policy marked as ticks under the curves (the
curves and ticks are the first seed's; the legend's counts are totals over
all seeds); on
traces with batch jobs, each policy's batch requests sent per second (dotted,
right axis). Writes a
PNG; changes nothing else.
"""

from __future__ import annotations

from pathlib import Path

COLOURS = {"reactive": "tab:red", "constant": "tab:orange", "holt": "tab:green", "forecast": "tab:blue",
           "constant_matched": "tab:purple"}


def plot(result: dict, out: str | Path) -> None:
    """Writes the figure for a bench result ({"traces": {name: {"policies": {...}}}})."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = result["traces"]
    fig, axes = plt.subplots(len(traces), 1, figsize=(11, 3.2 * len(traces)), squeeze=False)
    for ax, (name, tr) in zip(axes[:, 0], traces.items()):
        _row(ax, name, tr)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _row(ax, name: str, tr: dict) -> None:
    rate_ax = ax.twinx()
    first_run = next(iter(tr["policies"].values()))
    first = first_run["series"]
    rate_ax.fill_between([p["t"] for p in first], [p["rate"] for p in first], color="0.85", step="post")
    for policy, m in tr["policies"].items():
        if any(p.get("batch_rps") for p in m["series"]):
            rate_ax.plot([p["t"] for p in m["series"]], [p["batch_rps"] for p in m["series"]], ":",
                         color=COLOURS.get(policy), lw=1.0)
    rate_ax.set_ylabel("requests/s (trace)")
    ax.set_zorder(rate_ax.get_zorder() + 1)
    ax.patch.set_visible(False)
    top = 1
    for k, (policy, m) in enumerate(tr["policies"].items()):
        s = m["series"]
        t = [p["t"] for p in s]
        total = [p["prefill_target"] + p["decode_target"] for p in s]
        top = max(top, max(total))
        colour = COLOURS.get(policy, None)
        ax.step(t, total, where="post", color=colour, lw=1.4,
                label=f"{policy}: {m['ttft_slo_misses']} misses, {m['replica_seconds'] / 3600:.1f} replica-h, "
                      f"{sum(m['direction_changes'].values())} reversals")
        missed = [p["t"] for p in s if p.get("ttft_misses")]
        ax.plot(missed, [-0.4 - 0.35 * k] * len(missed), "|", color=colour, ms=5)
    ax.set_ylim(-0.5 - 0.35 * len(tr["policies"]), top + 1)
    ax.set_ylabel("replicas (prefill + decode)")
    ax.set_xlabel("compressed seconds")
    seeds = first_run.get("seeds") or [0]
    ax.set_title(f"{name}: replicas and load of seed {seeds[0]}; legend totals over {len(seeds)} seed(s)")
    ax.legend(loc="upper left", fontsize=7)
