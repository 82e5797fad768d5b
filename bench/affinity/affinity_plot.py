"""The figure of one or more `baton bench affinity` results.

Reads the JSON documents `bench.affinity.affinity` writes (``{"<layout>": {"pool_<on|off>": {...}}}``)
and draws, per layout and pool setting, each repeat's turn-2+ TTFT p50 for every policy
(left), and every moved turn's measured TTFT against the wait its router predicted had it
stayed (right: a point below the diagonal is a move that paid).

    python -m bench.affinity.affinity_plot docs/results/affinity/cost.png a.json [b.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def runs(docs: list[dict]) -> list[tuple[str, dict]]:
    """(label, pool report) for every layout and pool setting in ``docs``, in order."""
    out = []
    for doc in docs:
        for layout, pools in doc.items():
            if layout == "workload":
                continue
            for pool, report in pools.items():
                out.append((f"{layout}, {pool.replace('_', ' ')}", report))
    return out


def plot(docs: list[dict], path: Path) -> None:
    """Writes the figure to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = runs(docs)
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.6 * len(panels)), squeeze=False)
    for (label, report), (left, right) in zip(panels, axes):
        policies = [p for p in report if isinstance(report[p], dict) and "ttft_turn2plus_p50_s" in report[p]]
        for i, policy in enumerate(policies):
            reps = report[policy].get("repeats") or [report[policy]]
            xs = [r + 0.8 * i / len(policies) for r in range(len(reps))]
            left.bar(xs, [r["ttft_turn2plus_p50_s"] for r in reps], width=0.8 / len(policies), label=policy)
        ratios = report.get("ratio_to_round_robin", {}).get("baton", {})
        left.set_title(f"{label}: turn 2+ TTFT p50 per repeat; Baton / RR pooled "
                       f"{ratios.get('ttft_turn2plus_p50_s', '–')}", fontsize=9)
        left.set_xticks([r + 0.4 - 0.4 / len(policies) for r in range(len(reps))], [str(r + 1) for r in range(len(reps))])
        left.set_xlabel("repeat")
        left.set_ylabel("s")
        left.legend(fontsize=8)
        moves = report.get("baton", {}).get("moves", {}).get("each", [])
        pts = [(m["stay_s"], m["ttft_s"]) for m in moves if m.get("stay_s") is not None]
        if pts:
            right.scatter([p[0] for p in pts], [p[1] for p in pts], s=14)
            top = max(max(p) for p in pts) * 1.1
            right.plot([0, top], [0, top], color="grey", linewidth=0.8)
        right.set_title(f"{label}: Baton's {len(moves)} moves, measured TTFT vs predicted stay", fontsize=9)
        right.set_xlabel("predicted wait had it stayed (s)")
        right.set_ylabel("measured TTFT after the move (s)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    plot([json.loads(Path(p).read_text()) for p in argv[1:]], Path(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
