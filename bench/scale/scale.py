"""`baton bench scale`: what Baton itself costs at GPU request rates, on simulated engines.

Every system runs the same simulated engine: vLLM with its scheduler, KV
cache manager and OpenAI layer, and the forward pass replaced by the timed
executor (actors/sim/), priced from a GPU profile (default: Llama-3.1-8B on
an H100, from published figures) and sped up by `--speedup`.

`--part front` (default) sends the same open-loop Poisson chat load, at
rising rates, through each system in turn: `vllm_serve` (vLLM's own server),
`baton` (colocated, one engine) and, when named, `ray_serve_llm_fast` and
`baton_x2`, `baton_x4`... (that many colocated replicas, each a front on its
own engine, routed: what adding fronts does, and the Redis commands each
request costs), and `baton_pd`, `baton_pd_x2`... (disaggregated: that many
prefill and as many decode engines, each prompt's KV saved to the real
Mooncake store and loaded by decode, the transfer timed by the profile:
actors/sim/timed_store.py). A Baton system named with `_nolimit` at its end
(`baton_pd_nolimit`) runs without admission's lag limit
(deployments/admission/lag_limit.py), to compare with it in the same run.
The rounds alternate the order (A B, then B A).
Per system and rate it reports goodput (answers within `--slo-ms`), client
latency p50/p99, what the serving layer added over the engine's own time
(vLLM's per-request metrics), CPU seconds per request by process role
(front, ingress, engine core, Redis, the rest of Ray), requests per CPU-second
of the front, and Redis commands per request.

`--part agentic` runs agent sessions on `--fleet` engines in one process on
a virtual clock (bench/scale/scale_agentic.py, bench/scale/scale_fleet.py): Baton's
routing policy against round robin, with exact engine times.

`--part control` runs bench/scale/scale_control.py: the routing decision with Redis
and the KV indexer at 64 replicas, without engines.

JSON to stdout (and `--out`); `--plot`: goodput and p99 against offered rate.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from actors.sim import EXECUTOR
from bench.scale import scale_load
from bench.common.report import emit
from bench.common.peers import RayServeLLM, VllmServe
from bench.common.stack import StackProcess, bench_workdir, write_config
from common.config import load_config

SYSTEMS = ("vllm_serve", "baton", "ray_serve_llm_fast")
NO_LIMIT = "_nolimit"  # a Baton system's name ending: admission without its lag limit


def sim_engine(profile: str, speedup: float) -> dict:
    """Engine keyword arguments that put an engine on the timed executor."""
    return {"distributed_executor_backend": EXECUTOR,
            "additional_config": {"baton_sim": {"profile": profile, "speedup": speedup}}}


def baton_config(workdir: Path, engine: dict, replicas: int, block_size: int, disaggregated: bool = False,
                 lag_limit: bool = True) -> Path:
    """Baton on `replicas` simulated engines, colocated, or `disaggregated` with as many prefill
    engines again (their KV hop priced by the profile: actors/sim/timed_store.py). Each admits as many
    requests at once as the profiled GPU schedules: admission's default on the timed executor
    (common/config/admission.py), less where the front's loop lags unless `lag_limit` is off."""
    pools: dict = {"decode": {"engine_args": engine, "replicas": replicas}}
    if not lag_limit:
        pools["admission"] = {"max_loop_lag_s": None}
    if disaggregated:
        pools["prefill"] = {"engine_args": engine, "replicas": replicas}
    return write_config(workdir, colocated=not disaggregated, tracing={"exporter": "none"},
                        model={"block_size": block_size}, serve={"engine_metrics": True, "request_metrics": True},
                        **pools)


def replicas_of(system: str) -> int:
    """Baton's replica count (per pool) in a system's name: `baton` 1, `baton_x4` 4, `baton_pd_x2` 2."""
    system = system.removesuffix(NO_LIMIT)
    return int(system.split("_x")[1]) if system.startswith("baton") and "_x" in system else 1


@contextmanager
def started(system: str, workdir: Path, engine: dict, block_size: int):
    """(base URL, root PID, Redis client or None) while the system runs; stops it on exit."""
    cfg_path = baton_config(workdir / system, engine, replicas_of(system), block_size, system.startswith("baton_pd"),
                            lag_limit=not system.endswith(NO_LIMIT))
    cfg = load_config(cfg_path, environ={})
    if system == "vllm_serve":
        extra = ["--distributed-executor-backend", EXECUTOR, "--additional-config",
                 json.dumps(engine["additional_config"]), "--enable-per-request-metrics"]
        with VllmServe(cfg, workdir / "vllm-serve.log", extra=extra) as s:
            yield s.url, s.proc.pid, None
    elif system == "ray_serve_llm_fast":
        with RayServeLLM(workdir / f"{system}.log", fast=True, engine={**engine, "block_size": block_size}) as s:
            yield s.url, s.proc.pid, None
    else:
        stack = StackProcess(cfg_path)
        stack.start()
        try:
            yield stack.url, stack.proc.pid, cfg.redis.client()
        finally:
            stack.stop()


def _role(cmd: str) -> str:
    if "EngineCore" in cmd:
        return "engine"
    if "redis-server" in cmd:
        return "redis"
    if "ServeReplica" in cmd and ":prefill" in cmd:
        return "prefill"  # a prefill replica's front: its engine's prompts, from the decode fronts
    if "ServeReplica" in cmd and ":kv_indexer" in cmd:
        return "indexer"  # routed systems: the engines' KV events into Redis
    if "ServeReplica" in cmd or "api_server" in cmd:
        return "front"
    if "ProxyActor" in cmd or "haproxy" in cmd:
        return "ingress"
    return "other"


def cpu_by_role(root_pid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of the system's processes, by role."""
    import psutil

    out: dict[str, float] = {}
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for p in procs:
        try:
            cmd = p.name() + " " + " ".join(p.cmdline())
            t = p.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        role = _role(cmd)
        out[role] = out.get(role, 0.0) + t.user + t.system
    return out


def _redis_cmds(client) -> int | None:
    return None if client is None else int(client.info("stats")["total_commands_processed"])


def scrape(url: str) -> dict[str, float]:
    """Counters so far of the system that answers `url`'s /metrics: `gc_count` and `gc_s`, the
    front's full collections and the seconds they held it (`baton_gc_pause_seconds`,
    deployments/gc_pauses.py; absent where the system has no such series: `vllm serve`, Ray Serve
    LLM); `lag_count`, `lag_s` and `lag_under_50ms`, its event loop's lag samples, their sum and
    those under 50 ms (`baton_loop_lag_seconds`, deployments/loop_lag.py; absent there too); and
    `loaded_tokens`, prompt tokens its engines loaded over a KV transfer (vLLM's
    `prompt_tokens_by_source`). {} where /metrics does not answer."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {"loaded_tokens": 0.0}
    names = {"baton_gc_pause_seconds_count": "gc_count", "baton_gc_pause_seconds_sum": "gc_s"}
    lags = {"baton_loop_lag_seconds_count": "lag_count", "baton_loop_lag_seconds_sum": "lag_s"}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in names and s.labels.get("generation") == "2":
                out[names[s.name]] = s.value
            elif s.name in lags:
                out[lags[s.name]] = s.value
            elif s.name == "baton_loop_lag_seconds_bucket" and float(s.labels["le"]) == 0.05:
                out["lag_under_50ms"] = s.value
            elif s.name == "vllm:prompt_tokens_by_source_total" and s.labels.get("source") == "external_kv_transfer":
                out["loaded_tokens"] += s.value
    return out


def measure_rate(url: str, pid: int, redis, args, rate: float, seed: int) -> dict:
    """One rate's load through a running system, with its CPU and Redis costs."""
    n = max(20, int(rate * args.duration))
    bodies = scale_load.chat_bodies(n, args.words, args.max_tokens, args.model, args.stream, seed)
    cpu0, cmds0, m0 = cpu_by_role(pid), _redis_cmds(redis), scrape(url)
    shots, wall = scale_load.run(url, bodies, rate, seed=seed)
    cpu1, cmds1, m1 = cpu_by_role(pid), _redis_cmds(redis), scrape(url)
    out = scale_load.summarize(shots, wall, rate, args.slo_ms / 1000)
    done = max(out["ok"], 1)
    cpu = {role: round((cpu1.get(role, 0) - cpu0.get(role, 0)) / done * 1000, 3) for role in cpu1}
    out["cpu_ms_per_request"] = cpu
    front_ms = cpu.get("front", 0) + cpu.get("ingress", 0)
    out["requests_per_front_cpu_s"] = round(1000 / front_ms, 1) if front_ms else None
    if cmds0 is not None:
        out["redis_cmds_per_request"] = round((cmds1 - cmds0) / done, 2)
    if "gc_count" in m0 and "gc_count" in m1:  # the front's full garbage collections meanwhile
        out["full_gc"] = {"count": int(m1["gc_count"] - m0["gc_count"]),
                          "held_ms": round((m1["gc_s"] - m0["gc_s"]) * 1000, 1)}
    if "lag_count" in m0 and "lag_count" in m1 and m1["lag_count"] > m0["lag_count"]:  # the front's loop
        n = m1["lag_count"] - m0["lag_count"]
        out["loop_lag"] = {"mean_ms": round((m1["lag_s"] - m0["lag_s"]) / n * 1000, 2),
                           "over_50ms": round(1 - (m1["lag_under_50ms"] - m0["lag_under_50ms"]) / n, 4)}
    if "loaded_tokens" in m0 and "loaded_tokens" in m1:  # disaggregated: the KV decode took from the store
        out["kv_loaded_tokens_per_request"] = round((m1["loaded_tokens"] - m0["loaded_tokens"]) / done, 1)
    return out


def sweep(system: str, workdir: Path, args, engine: dict) -> list[dict]:
    """The system started once, warmed up, then each rate in turn until goodput stops rising."""
    t0 = time.monotonic()
    print(f"  starting {system} ...", file=sys.stderr, flush=True)
    rows: list[dict] = []
    with started(system, workdir, engine, args.block_size) as (url, pid, redis):
        print(f"  {system} ready after {time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)
        scale_load.run(url, scale_load.chat_bodies(20, args.words, args.max_tokens, args.model, False, 999), 20)
        best = 0.0
        for i, rate in enumerate(args.rates):
            row = measure_rate(url, pid, redis, args, rate, seed=i)
            rows.append(row)
            print(f"    {rate:>6.0f} req/s offered: goodput {row['goodput_rps']:.1f}, p99 {row['latency_p99_ms']} ms, "
                  f"added p99 {row['added_p99_ms']} ms, front {row['requests_per_front_cpu_s']} req/CPU-s, "
                  f"errors {row['errors']}, full GCs {row.get('full_gc')}, loop lag {row.get('loop_lag')}, "
                  f"KV loaded per request {row.get('kv_loaded_tokens_per_request')}", file=sys.stderr, flush=True)
            if row["goodput_rps"] < best * 1.02 and row["goodput_rps"] < 0.9 * rate:
                break  # past the knee: goodput stopped rising
            best = max(best, row["goodput_rps"])
    return rows


def knee(rows: list[dict]) -> dict | None:
    """The row with the highest goodput."""
    return max(rows, key=lambda r: r["goodput_rps"], default=None)


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if doc.get("part") == "agentic":
        return plot_agentic(doc, path, plt)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for i, rnd in enumerate(doc["rounds"]):
        for system, rows in rnd["results"].items():
            x = [r["offered_rps"] for r in rows]
            style = "-o" if i == 0 else "--x"
            a.plot(x, [r["goodput_rps"] for r in rows], style, label=f"{system} r{i + 1}")
            b.plot(x, [r["latency_p99_ms"] or 0 for r in rows], style, label=f"{system} r{i + 1}")
    a.set(xlabel="offered req/s", ylabel="goodput req/s", title="goodput")
    b.set(xlabel="offered req/s", ylabel="p99 ms", title="client latency p99", yscale="log")
    a.legend(fontsize=7)
    fig.suptitle(f"bench scale: {doc['engine']['profile']} x{doc['engine']['speedup']}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def plot_agentic(doc: dict, path: Path, plt) -> None:
    """TTFT p50 of turn 1 and of later turns, Baton against round robin, per fleet size and round."""
    runs = doc["runs"]
    fig, ax = plt.subplots(figsize=(9, 4))
    labels = [f"{r['replicas']} engines\nround {r['round']}" for r in runs]
    for j, (policy, key) in enumerate([(p, k) for k in ("turn1_ttft_p50_ms", "later_ttft_p50_ms")
                                       for p in ("baton", "round_robin")]):
        ax.bar([i + 0.2 * j for i in range(len(runs))], [r[policy][key] for r in runs], width=0.2,
               label=f"{policy} {'turn 1' if key.startswith('turn1') else 'turn 2+'}")
    ax.set_xticks([i + 0.3 for i in range(len(runs))], labels, fontsize=8)
    ax.set(ylabel="TTFT p50 (virtual ms)", title="agent sessions: Baton's policy vs round robin (exact engine time)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def ratios(results: dict[str, list[dict]]) -> dict:
    """Each Baton system's goodput over vllm serve's at vllm serve's knee, and per rate what it added
    to the client's latency p99 beyond what vllm serve's own layer added (keys named by system:
    `baton_goodput_at_vllm_knee`, `baton_pd_added_p99_over_vllm_ms`...)."""
    if "vllm_serve" not in results:
        return {}
    out: dict = {}
    kv = knee(results["vllm_serve"])
    for system in (s for s in results if s.startswith("baton")):
        by_rate = {r["offered_rps"]: r for r in results[system]}
        if kv and kv["goodput_rps"] > 0 and kv["offered_rps"] in by_rate:
            goodput = by_rate[kv["offered_rps"]]["goodput_rps"]
            out[f"{system}_goodput_at_vllm_knee"] = round(goodput / kv["goodput_rps"], 3)
        out[f"{system}_added_p99_over_vllm_ms"] = {
            str(v["offered_rps"]): round(by_rate[v["offered_rps"]]["added_p99_ms"] - v["added_p99_ms"], 2)
            for v in results["vllm_serve"] if v["offered_rps"] in by_rate
            and by_rate[v["offered_rps"]]["added_p99_ms"] is not None and v["added_p99_ms"] is not None}
    return out


def front(args) -> dict:
    engine = sim_engine(args.profile, args.speedup)
    systems = args.systems.split(",")
    workdir = bench_workdir("bench-scale")
    doc: dict = {"engine": {"profile": args.profile, "speedup": args.speedup},
                 "load": {"words": args.words, "max_tokens": args.max_tokens, "stream": args.stream,
                          "slo_ms": args.slo_ms, "duration_s": args.duration}, "rounds": []}
    for n in range(args.rounds):
        order = systems if n % 2 == 0 else systems[::-1]
        print(f"round {n + 1}/{args.rounds}: {', '.join(order)}", file=sys.stderr, flush=True)
        results = {s: sweep(s, workdir / f"round{n + 1}", args, engine) for s in order}
        doc["rounds"].append({"order": order, "results": results, "ratios": ratios(results)})
    return doc


def agentic(args) -> dict:
    """Baton's policy and round robin on each fleet size, alternating which runs first."""
    import os

    from bench.scale.scale_agentic import Shape, compare
    from bench.scale.scale_trace import TraceRun, TraceShape

    os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"  # the tiny model's config stands in for an 8B's
    model = str(load_config(None, environ={}).model.resolved_path())
    fleets = [int(n) for n in args.fleet.split(",")]
    rates = [float(r) for r in args.session_rate.split(",")]
    thinks = [float(t) for t in args.think_s.split(",")]
    doc: dict = {"engine": {"profile": args.profile}, "part": "agentic", "runs": []}
    t0 = time.monotonic()

    def progress(msg: str) -> None:
        print(f"  [{time.monotonic() - t0:6.0f}s] {msg}", file=sys.stderr, flush=True)

    speeds = [float(x) for x in args.trace_speed.split(",")]
    for r in range(args.rounds):
        for i, n in enumerate(fleets):
            order = ["baton", "round_robin"] if (r + i) % 2 == 0 else ["round_robin", "baton"]
            if args.workload == "trace":
                shape, kind = TraceShape(speed=speeds[i], limit=args.trace_limit), TraceRun
            else:
                shape, kind = Shape(session_rate=rates[i], duration_s=args.duration, think_s=thinks[i], seed=r), None
            res = compare(n, shape, model, args.profile, order, progress, kind)
            doc["runs"].append({"round": r + 1, "workload": args.workload, "shape": vars(shape), **res})
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="baton bench scale", description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("front", "agentic", "control"), default="front")
    p.add_argument("--fleet", default="16,64", help="agentic: engine counts, comma-separated")
    p.add_argument("--session-rate", default="40,125", help="agentic: new sessions per virtual second, per fleet")
    p.add_argument("--think-s", default="3,10", help="agentic: mean seconds between a turn's answer and the "
                   "next turn (tool calls, people), per fleet")
    p.add_argument("--workload", choices=("sessions", "trace"), default="sessions",
                   help="agentic: generated agent sessions, or the conversation trace (bench/scale/scale_trace.py)")
    p.add_argument("--trace-speed", default="10,40", help="agentic trace: trace seconds per virtual second, per fleet")
    p.add_argument("--trace-limit", type=int, default=4000, help="agentic trace: requests replayed")
    p.add_argument("--systems", default="vllm_serve,baton")
    p.add_argument("--rates", default="25,50,100,200,400", help="offered requests/s, comma-separated")
    p.add_argument("--duration", type=float, default=15, help="seconds of load per rate")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--profile", default="h100_llama31_8b")
    p.add_argument("--speedup", type=float, default=1.0)
    p.add_argument("--block-size", type=int, default=16, help="the profiled GPU's block size")
    p.add_argument("--words", type=int, default=60, help="corpus words per prompt")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--slo-ms", type=float, default=1000)
    p.add_argument("--model", default="baton-tiny")
    p.add_argument("--out", type=Path)
    p.add_argument("--plot", type=Path)
    args, rest = p.parse_known_args(argv)
    if args.part == "control":
        from bench.scale import scale_control

        return scale_control.main(rest)
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    args.rates = [float(r) for r in args.rates.split(",")]
    named = args.systems.split(",")
    if unknown := {s for s in named if s not in SYSTEMS and not s.startswith(("baton_x", "baton_pd"))
                   and s != "baton" + NO_LIMIT}:
        p.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    doc = agentic(args) if args.part == "agentic" else front(args)
    emit(doc, args.out, args.plot, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
