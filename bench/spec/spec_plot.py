"""Plot of `baton bench spec`: TPOT p50 per system, one panel per workload. Writes a PNG."""

from __future__ import annotations

from pathlib import Path

COLOURS = {"off": "0.6", "ngram": "tab:blue", "draft": "tab:green"}


def plot(doc: dict, out: str | Path) -> None:
    """Bars of TPOT p50 for each mode/method, labelled with the acceptance rate; changes nothing else."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(doc["workloads"])
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names):
        labels, values, colours, notes = [], [], [], []
        for system, res in doc["results"].items():
            w = res.get(name) if isinstance(res, dict) else None
            if not isinstance(w, dict) or w.get("tpot_p50_ms") is None:
                continue
            labels.append(system.replace("disaggregated", "PD").replace("colocated", "coloc"))
            values.append(w["tpot_p50_ms"])
            colours.append(COLOURS.get(system.split("/")[1], "0.3"))
            rate = w.get("acceptance_rate")
            notes.append("" if rate is None else f"acc {rate:.2f}")
        bars = ax.bar(range(len(values)), values, color=colours)
        for bar, note in zip(bars, notes):
            ax.annotate(note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                        va="bottom", fontsize=7)
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        wl = doc["workloads"][name]
        ax.set_title(f"{name} (concurrency {wl['concurrency']}, {wl['requests']} requests)")
        ax.set_ylabel("TPOT p50, ms")
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
