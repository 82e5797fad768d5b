"""`baton bench chaos`: each component killed in turn under steady traffic, and what users saw.

One Baton stack (`baton up`: disaggregated, colocated, a model catalogue, or
one of two sites; on real CPU engines or on the timed executor, actors/sim/)
takes steady mixed traffic (bench/chaos/traffic.py: streamed and plain chat,
agent sessions with `x-session-affinity`) at `--load` of its measured
capacity. For each fault (bench/chaos/faults.py; a catalogue's: swap.py; a
site's: sites.py) the traffic runs `--before` seconds, the component is
SIGKILLed, and the traffic runs `--after` seconds more; then the bench waits
until the component is back before the next.

Per fault it reports:
- every request's outcome (bench/chaos/outcomes.py): ok, retried, clean_error,
  the failures a client sees (dropped, broken), and what must be 0 (`silent`:
  hung, truncated, an error not in OpenAI's shape);
- of the requests that had no byte yet when the component died (in flight
  then, or sent after), the share answered (`unaffected_share`), and how many
  streams were cut mid-answer (those end with an error event, or are truncated);
- `goodput_back_s`: seconds until answers per second are within 10% of
  before the kill; `goodput_settled_s`: until they stay there (after the
  last dip); `component_back_s`: until the component itself is back;
  `signalled_s`: until the killed process was gone (finding it and the kill's own time);
- batch lines and stored responses lost or duplicated (bench/chaos/durable.py:
  a batch job and Responses-API chains run beside the traffic).
JSON, and a timeline plot of good and bad answers per second around each kill.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from bench.chaos.durable import Durable
from bench.chaos.faults import FAULTS, FREEZES, Fault
from bench.chaos.outcomes import (BAD, SILENT, counts, failures, goodput_back_s, goodput_settled_s, routing,
                                  timeline)
from bench.chaos.sites import NAME as SITE, SiteFault, SitePair
from bench.chaos.swap import NAME as SWAP, SwapFault
from bench.chaos.traffic import Traffic
from bench.common.report import emit
from bench.common.stack import StackProcess, bench_workdir, write_config
from common.config import load_config

# CI's two minutes: a replica's replacement (~20 s) bounds its fault's run whatever `after` says
SHORT = {"engine": "timed", "layout": "colocated", "replicas": 3, "ingress": "haproxy",
         "faults": "decode,engine,ingress,indexer,redis,mooncake-store",
         "before": 2.0, "after": 6.0, "capacity_s": 4.0}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="baton bench chaos", description=__doc__.splitlines()[0])
    p.add_argument("--layout", choices=("disaggregated", "colocated", "catalogue", "sites"), default="disaggregated",
                   help="catalogue: one colocated replica serving the default model and two catalogue "
                        "models, room for two (its fault: model-swap, bench/chaos/swap.py); sites: two "
                        "colocated sites, the traffic at `a`, which forwards what it cannot take to `b` "
                        "(its fault: site, bench/chaos/sites.py)")
    p.add_argument("--engine", choices=("cpu", "timed"), default="cpu",
                   help="real CPU engines, or the timed executor (colocated only: it moves no KV)")
    p.add_argument("--ingress", choices=("auto", "direct", "haproxy"), default="auto",
                   help="serve.ingress: auto (HAProxy under baton up), the replicas on the public port, or HAProxy "
                        "in front (cluster/ingress.py)")
    p.add_argument("--replicas", type=int, help="decode (or colocated) replicas: 2; 1 in a catalogue, and a site")
    p.add_argument("--faults", default=",".join(FAULTS),
                   help=f"comma-separated, of {','.join(FAULTS)} (kills), {','.join(FREEZES)} (SIGSTOP, "
                        f"then SIGCONT), {SWAP} (a catalogue's waking engine killed) and {SITE} (a site killed)")
    p.add_argument("--freeze-s", type=float, default=10.0, help="how long a `:freeze` fault keeps its component stopped")
    p.add_argument("--load", type=float, default=0.7, help="offered rate as a share of the measured capacity")
    p.add_argument("--capacity-s", type=float, default=8.0, help="seconds of closed-loop traffic that measure the capacity")
    p.add_argument("--rate", type=float, help="offered requests/s (instead of --load)")
    p.add_argument("--before", type=float, default=10.0, help="seconds of traffic before each kill")
    p.add_argument("--after", type=float, default=30.0, help="seconds of traffic after each kill")
    p.add_argument("--deadline", type=float, default=30.0, help="seconds without a byte that make a request hung")
    p.add_argument("--recover-timeout", type=float, default=300.0, help="longest wait for a component to be back")
    p.add_argument("--batch-timeout", type=float, default=120.0,
                   help="longest wait after the traffic for the fault's batch job to finish")
    p.add_argument("--short", action="store_true",
                   help="the CI mode: timed executor, colocated, 3 replicas behind HAProxy, one fault per component kind")
    p.add_argument("--out", type=Path)
    p.add_argument("--plot", type=Path)
    args = p.parse_args(argv)
    if args.short:
        for k, v in SHORT.items():
            setattr(args, k, v)
    if args.engine == "timed" and args.layout != "colocated":
        p.error("--engine timed runs colocated only (the timed executor moves no KV)")
    if args.replicas is None:
        args.replicas = 1 if args.layout in ("catalogue", "sites") else 2
    return args


def stack_config(args: argparse.Namespace, workdir: Path) -> Path:
    """The stack's config: the layout, replicas and engine asked for; heartbeats every second."""
    decode: dict = {"replicas": args.replicas}
    model = {}
    if args.engine == "timed":
        from bench.scale.scale import sim_engine

        decode["engine_args"] = sim_engine("h100_llama31_8b", 1.0)
        model = {"block_size": 16}
    extra = {}
    if args.layout == "catalogue":  # the default model and two of cluster/catalogue.yaml's; two fit
        import yaml

        from common.constants import REPO_ROOT

        listed = yaml.safe_load((REPO_ROOT / "cluster" / "catalogue.yaml").read_text())["models"]
        decode["kv_cache_gb"] = 0.25
        extra = {"models": [m for m in listed if m["id"] in ("baton-small", "baton-deep")],
                 "catalogue": {"memory_gb": 0.6, "min_resident_s": 2}}
    # a batch line whose front died runs again once its lease lapsed: 6 s, not 30, within a fault's run
    return write_config(workdir, colocated=args.layout != "disaggregated", tracing={"exporter": "none"},
                        model=model, decode=decode, routing={"heartbeat_s": 1, "replica_timeout_s": 3},
                        batch={"lease_s": 6}, serve={"ingress": args.ingress}, **extra)


def capacity(url: str, model: str, seconds: float = 8.0, concurrency: int = 8) -> float:
    """Whole answers per second of the traffic's own mix from `concurrency` closed-loop clients."""
    return asyncio.run(Traffic(url, model, rate=1.0, seed=99).closed(seconds, concurrency))


async def _under_traffic(fault: Fault | SwapFault | SiteFault, traffic: Traffic, durable: Durable,
                         args) -> tuple[float, float, str, float, float | None, dict]:
    """Runs the traffic and the durable work, kills at `before`; (start, kill time, victim, seconds
    until the killed process was gone (finding it takes a moment, and dying another), seconds until
    the component was back, what the durable work lost)."""
    start = time.monotonic()
    load = asyncio.gather(traffic.run(args.before + args.after), durable.chains(args.before + args.after),
                          durable.start_batch(max(0.0, args.before - 1.0)))
    await asyncio.sleep(args.before)
    killed_at = time.monotonic()
    victim = await asyncio.to_thread(fault.inject)
    signalled = round(time.monotonic() - killed_at, 3)
    back = None
    while back is None and time.monotonic() - killed_at < args.recover_timeout:
        if await asyncio.to_thread(fault.recovered):
            back = round(time.monotonic() - killed_at, 2)
        else:
            await asyncio.sleep(0.5)
    await load
    return start, killed_at, victim, signalled, back, await durable.report(args.batch_timeout)


def run_fault(fault: Fault | SwapFault | SiteFault, rate: float, model: str, args, seed: int) -> dict:
    """One fault under traffic; its report (see the module docstring)."""
    fault.prepare()
    traffic = Traffic(fault.stack.url, model, rate, deadline_s=args.deadline, seed=seed)
    durable = Durable(fault.stack.url, model)
    start, killed_at, victim, signalled, back, kept = asyncio.run(_under_traffic(fault, traffic, durable, args))
    attempts = traffic.attempts
    end = max((a.ended for a in attempts if a.ended), default=killed_at)
    no_byte = [a for a in attempts if a.sent >= killed_at
               or ((a.first_byte is None or a.first_byte > killed_at) and (a.ended or 0) > killed_at)]
    cut = [a for a in attempts if a.stream and a.first_byte is not None and a.first_byte <= killed_at
           and (a.ended or 0) > killed_at]
    answered = sum(1 for a in no_byte if a.outcome() in ("ok", "retried"))
    good_ends = sorted(a.ended for a in attempts if a.ended and a.outcome() in ("ok", "retried"))
    c = counts(attempts)
    return {
        "fault": fault.name, "killed": victim, "offered_rps": round(rate, 2), "sent": len(attempts), **c,
        "bad": sum(c[k] for k in BAD), "silent": sum(c[k] for k in SILENT),
        "no_byte_at_kill": len(no_byte), "unaffected_share": round(answered / len(no_byte), 4) if no_byte else None,
        "streams_cut": len(cut), "streams_cut_outcomes": counts(cut),
        "goodput_back_s": goodput_back_s(good_ends, killed_at, end, before_s=min(args.before, 10.0)),
        "goodput_settled_s": goodput_settled_s(good_ends, killed_at, max(a.sent for a in attempts),
                                               before_s=min(args.before, 10.0)),
        "component_back_s": back, "kill_at_s": round(killed_at - start, 2), "signalled_s": signalled,
        "timeline": timeline(attempts, start, end), "failures": failures(attempts, killed_at),
        **kept, **fault.report(),
        **routing(attempts, killed_at, None if back is None else killed_at + back),
    }


def plot(doc: dict, path: Path) -> None:
    """Good and bad answers per second around each kill, one panel per fault."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["faults"]
    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 2.2 * len(runs)), squeeze=False)
    for ax, r in zip(axes[:, 0], runs):
        t = list(range(len(r["timeline"]["good"])))
        ax.plot(t, r["timeline"]["good"], label="answered", color="tab:green")
        ax.bar(t, r["timeline"]["bad"], label="bad (error, hung, cut)", color="tab:red", alpha=0.6)
        ax.axvline(r["kill_at_s"], color="black", linestyle="--", label="kill")
        if r["component_back_s"] is not None:
            ax.axvline(r["kill_at_s"] + r["component_back_s"], color="tab:blue", linestyle=":", label="back")
        what = r["fault"].replace(":freeze", " frozen") if ":freeze" in r["fault"] else f"{r['fault']} killed"
        ax.set_title(f"{what} ({doc['layout']}, {doc['engine']} engines)", fontsize=9)
        ax.set_ylabel("per s")
    axes[0, 0].legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def _started(args, workdir: Path) -> tuple[StackProcess, SitePair | None]:
    """The stack the traffic goes to, started (with its peer site, for `--layout sites`)."""
    print(f"starting Baton ({args.layout}, {args.engine} engines, {args.replicas} replicas) ...", file=sys.stderr)
    if args.layout == "sites":
        pair = SitePair(workdir / "sites-cpu")
        pair.start()
        return pair.stacks["a"], pair
    stack = StackProcess(stack_config(args, workdir / f"{args.layout}-{args.engine}"))
    stack.start()
    return stack, None


def _fault(name: str, stack: StackProcess, pair: SitePair | None, model: str, args):
    if name == SWAP:
        return SwapFault(stack, model, args.deadline)
    if name == SITE:
        return SiteFault(pair)
    return Fault(stack, name, args.freeze_s)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    stack, pair = _started(args, bench_workdir("chaos"))
    runs = []
    try:
        model = load_config(stack.config, environ={}).model.served_name
        rate = args.rate or args.load * capacity(stack.url, model, args.capacity_s)
        print(f"offered rate {rate:.1f} req/s", file=sys.stderr)
        for i, name in enumerate(n for n in args.faults.split(",") if n):
            fault = _fault(name, stack, pair, model, args)
            if not fault.applies():
                print(f"  {name}: not in this layout, skipped", file=sys.stderr)
                continue
            print(f"  [{i + 1}] {name}: {args.before:.0f} s, {'freeze' if ':freeze' in name else 'kill'}, "
                  f"{args.after:.0f} s ...", file=sys.stderr)
            r = run_fault(fault, rate, model, args, seed=i)
            print(f"      sent {r['sent']}, bad {r['bad']} (silent {r['silent']}), unaffected {r['unaffected_share']}, "
                  f"goodput back {r['goodput_back_s']} s, component back {r['component_back_s']} s", file=sys.stderr)
            runs.append(r)
    finally:
        (pair or stack).stop()
    doc = {"bench": "chaos", "layout": args.layout, "engine": args.engine, "ingress": args.ingress,
           "replicas": args.replicas,
           "load": args.load, "deadline_s": args.deadline, "faults": runs}
    emit(doc, args.out, args.plot, plot)
    return 0
