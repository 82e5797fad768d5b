"""The plot of `baton bench sites` (bench/sites/sites.py): utilisation per site per policy, sites in
order of RTT from the hotspot (nearest first), and each policy's rejections and max/mean
utilisation. Pure but for the plot's file."""

from __future__ import annotations

from pathlib import Path

from bench.sites.sites_geo import CITY, rtt_s


def site_order(names: list[str], hotspot: str | None) -> list[str]:
    """``names`` by RTT from ``hotspot`` (it first), or as given when any of them is not a known city."""
    if hotspot not in CITY or any(n not in CITY for n in names):
        return list(names)
    return sorted(names, key=lambda n: (rtt_s(CITY[hotspot], CITY[n]), n))


def plot(doc: dict, path: Path) -> None:
    """Top: grouped bars of each site's utilisation per policy; bottom: rejections and max/mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = doc["policies"]
    names = list(policies)
    hotspot = doc.get("config", {}).get("hotspot")
    sites = site_order(list(next(iter(policies.values()))["utilisation"]), hotspot)
    fig = plt.figure(figsize=(max(10, 0.25 * len(sites)), 8))
    grid = fig.add_gridspec(2, 2, height_ratios=(1.4, 1))
    ax = fig.add_subplot(grid[0, :])
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        util = policies[name]["utilisation"]
        ax.bar([x - 0.4 + width * (i + 0.5) for x in range(len(sites))], [util[s] for s in sites], width,
               label=f"{name} (max/mean {policies[name]['util_max_over_mean']})")
    ax.set_xticks(range(len(sites)), sites, rotation=90, fontsize=7)
    ax.set_xlim(-0.6, len(sites) - 0.4)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("utilisation (busy permits / permits)")
    factor = doc.get("config", {}).get("hotspot_factor")
    ax.set_title(f"utilisation per site, by RTT from the hotspot ({hotspot}, {factor}x)")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    bottom = [fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])]
    for ax2, key, title in ((bottom[0], "rejected", "out-of-capacity rejections"),
                            (bottom[1], "util_max_over_mean", "max/mean utilisation across sites")):
        values = [policies[n][key] or 0 for n in names]
        bars = ax2.bar(names, values, color=[f"C{i}" for i in range(len(names))])
        ax2.bar_label(bars, labels=[str(v) for v in values], fontsize=8)
        ax2.set_title(title)
        ax2.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
