"""`baton bench sites`: routing across sites, nearest-only against random-near under a hotspot.

Mode ``--sim`` (the default, bench/sites/sites_sim.py): ``--sites`` real cities
(RTT from great-circle distance, load by local time of day), one of them
(``--hotspot``) receiving ``--hotspot-factor`` times its usual traffic at its
local 14:00. Every policy of bench/sites/sites_sim.POLICIES runs over the same
seeded workload: ``random_near`` (routing/sites/site_select.SiteSelector),
``nearest_only`` and ``local_only`` (routing/sites/site_baselines.py). Prints
progress on stderr and one JSON line on stdout: each policy's metrics
(bench/sites/sites_metrics.py) and the targets of issue 35, random_near against
nearest_only:
  - out-of-capacity rejections at least 30% fewer;
  - max/mean utilisation across sites at least 30% lower;
  - median added RTT of the forwarded requests at most one neighbour hop
    (the fleet's median nearest-neighbour RTT; the stricter per-origin
    ratio is reported next to it);
  - session keep (turn 2+ served on the session's site) within 2 points of
    local_only's, the single-site run; where the answers report cached
    tokens (``--local``), turns 2+'s cached share of their prompt at least
    0.95 of the single-site run's instead.

    python -m bench.sites.sites                                   # 70 sites, 5x at Frankfurt
    python -m bench.sites.sites --out docs/results/sites/sim.json --plot docs/results/sites/sim.png

Other modes plug into MODES: a function of the parsed arguments returning
{"policies": {name: metrics}, ...}, selected by a flag in the mode group.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from bench.sites.sites_sim import POLICIES, SimConfig, simulate
from routing.sites.site_select import SiteSelectConfig

TARGET_REDUCTION = 0.30
KEEP_SLACK = 0.02
CACHED_SHARE_RATIO = 0.95


def _log(msg: str) -> None:
    print(f"[bench_sites] {msg}", file=sys.stderr, flush=True)


def run_sim(args: argparse.Namespace) -> dict:
    """Every policy over one seeded simulated workload; progress on stderr."""
    cfg = SimConfig(sites=args.sites, hotspot=args.hotspot, hotspot_factor=args.hotspot_factor,
                    duration_s=args.duration, warmup_s=args.warmup, peak_util=args.peak_util, seed=args.seed)
    select = SiteSelectConfig()
    policies = {}
    for name in args.policies:
        started = time.monotonic()
        _log(f"{name}: simulating {cfg.sites} sites for {cfg.duration_s:.0f} s ...")
        policies[name] = simulate(cfg, name, select)
        m = policies[name]
        _log(f"{name}: {m['requests']} requests, {m['rejected']} rejected, max/mean utilisation "
             f"{m['util_max_over_mean']} ({time.monotonic() - started:.1f} s)")
    return {"config": asdict(cfg), "select": asdict(select), "policies": policies}


def run_local(args: argparse.Namespace) -> dict:
    from bench.sites import sites_local

    return sites_local.run(args)


MODES: dict[str, Callable[[argparse.Namespace], dict]] = {"sim": run_sim, "local": run_local}


def _reduction(new: float | None, old: float | None) -> float | None:
    if new is None or not old:
        return None
    return round(1.0 - new / old, 3)


def targets(policies: dict[str, dict]) -> dict:
    """Issue 35's targets, random_near against nearest_only (and local_only for session keep)."""
    rn, no = policies.get("random_near"), policies.get("nearest_only")
    if rn is None or no is None:
        return {}
    rej = _reduction(rn["rejected"], no["rejected"]) if no["rejected"] else (0.0 if rn["rejected"] else None)
    util = _reduction(rn["util_max_over_mean"], no["util_max_over_mean"])
    hops = rn["added_rtt_hops"]["forwarded_p50_fleet_hops"]
    single = policies.get("local_only", {}).get("session_keep")
    keep = rn["session_keep"]
    # Where answers report cached tokens (the local sites), sessions keeping their site is measured
    # as the issue words it: turns 2+ find their prompt cached nearly as often as on a single site.
    cached = rn.get("turn2_cached_share")
    cached_single = policies.get("local_only", {}).get("turn2_cached_share")
    out = {
        "rejections_reduction": rej,
        "rejections_ok": rej is not None and rej >= TARGET_REDUCTION,
        "max_over_mean_reduction": util,
        "max_over_mean_ok": util is not None and util >= TARGET_REDUCTION,
        "added_rtt_all_p50_ms": rn["added_rtt_ms"]["all_p50"],
        "added_rtt_forwarded_p50_fleet_hops": hops,
        "added_rtt_forwarded_p50_origin_hops": rn["added_rtt_hops"]["forwarded_p50_origin_hops"],
        "added_rtt_ok": hops is None or hops <= 1.0,
        "session_keep": keep,
        "session_keep_single_site": single,
        "session_keep_ok": keep is not None and (single is None or keep >= single - KEEP_SLACK),
    }
    if cached is not None and cached_single:
        out["turn2_cached_share_vs_single_site"] = round(cached / cached_single, 3)
        out["session_keep_ok"] = cached >= CACHED_SHARE_RATIO * cached_single
    out["met"] = all(v for k, v in out.items() if k.endswith("_ok"))
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="baton bench sites", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--sim", dest="mode", action="store_const", const="sim",
                      help="simulated sites driving the real policies (default)")
    mode.add_argument("--local", dest="mode", action="store_const", const="local",
                      help="three Baton stacks on this machine behind delay proxies (bench/sites/sites_local.py)")
    p.set_defaults(mode="sim")
    p.add_argument("--base-rps", type=float, default=0.0,
                   help="--local: requests/s at each site before the hotspot; 0: from a measured service time")
    p.add_argument("--local-duration", type=float, default=60.0,
                   help="--local: measured seconds of arrivals per policy, split over the rounds")
    p.add_argument("--rounds", type=int, default=2,
                   help="--local: segments per policy on the same sites, in alternating order (A B C, C B A)")
    p.add_argument("--permits", type=int, default=2, help="--local: engine permits per site")
    p.add_argument("--hot-load", type=float, default=None,
                   help="--local: the hot site's offered requests over a site's measured capacity "
                   "(base-rps 0); default 1.4")
    p.add_argument("--site-cpu", type=float, default=None,
                   help="--local: cores of CPU time per site (a cgroup quota); 0: none; default 0.5 where allowed")
    p.add_argument("--sites", type=int, default=SimConfig.sites, help="simulated sites (real cities), >= 2")
    p.add_argument("--hotspot", default=SimConfig.hotspot, help="the city that receives the hotspot")
    p.add_argument("--hotspot-factor", type=float, default=SimConfig.hotspot_factor,
                   help="the hotspot's traffic as a multiple of its usual")
    p.add_argument("--duration", type=float, default=SimConfig.duration_s, help="simulated seconds")
    p.add_argument("--warmup", type=float, default=SimConfig.warmup_s, help="unmeasured first seconds")
    p.add_argument("--peak-util", type=float, default=SimConfig.peak_util,
                   help="an ordinary site's busy fraction at its daily peak")
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    p.add_argument("--plot", type=Path, default=None, help="utilisation per site and rejections (PNG)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started = time.monotonic()
    doc = {"mode": args.mode, **MODES[args.mode](args)}
    doc["targets"] = targets(doc["policies"])
    if args.plot is not None:
        from bench.sites.sites_plot import plot

        plot(doc, args.plot)
        doc["plot"] = str(args.plot)
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    line = json.dumps(doc)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    _log(f"targets: {json.dumps(doc['targets'])}")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
