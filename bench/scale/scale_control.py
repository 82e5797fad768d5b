"""Baton's control plane at scale, without engines or HTTP fronts.

Two figures, each on the real code and a real redis-server (started here, on
127.0.0.1, without persistence):

1. ``routing``: one routing decision is ``RequestRouting.route`` of
   deployments/front/request_routing.py, exactly what a front awaits per request:
   tenant-salted block hashing, what it reads from Redis (the pins, a new
   session's placement script and the index slice only without the front's
   copies, deployments/front/pin_feed.py and deployments/kv_index/index_feed.py;
   the registry and the fronts' counts only when its shared view is stale),
   the policy and the pin writes it queues without waiting. Each decided request
   is started on the front (its counts written to Redis) and finished
   ``IN_FLIGHT`` decisions later, so every decision sees the counts move as a
   busy front's do. Redis holds
   ``replicas`` colocated replicas (each a front) with heartbeats, in-flight and
   queued-work fields for every (replica, front) pair, ``sessions`` pinned
   sessions, every tenant's system prompt indexed on every replica and active
   conversations on their pinned one. Half the decisions are a pinned session's
   next turn, half a new session. ``redis_cmds_per_decision``: INFO's commands
   delta (a script's count too); ``redis_cpu_us_per_decision``: Redis's own CPU
   time per decision. ``with_redis_index``: ``routing.local_index: false``.
2. ``indexer`` (bench/scale/scale_indexer.py): ``engines`` simulated engines
   publish vLLM KV events through vLLM's own ``ZmqEventPublisher`` (one per
   engine, topic = replica, with a replay socket) from ``publishers`` child
   processes, to the real KV indexer (``deployments/kv_index/kv_indexer.EventLoop``,
   its Serve wrapper aside). Each engine steps every ``step_ms`` and per step
   stores the blocks a chat workload at 70% of an H100 would (``engine_rates``:
   GpuProfile prefill and decode times; 1k new prompt tokens and 256 output
   tokens per request at 4k context, 64 sequences decoding), as one new chain
   (BlockStored, salt in its first block's extra keys), and evicts as many old
   blocks (BlockRemoved) once it holds ``WINDOW_BLOCKS``. A prober process
   polls, every millisecond, the same Redis read a front makes
   (``queue_snapshot``) for sampled chains' last block until the index names
   the engine: ``lag_*_ms`` is from the batch's publish call to that, so it
   includes the publisher's own queue and up to ~1 ms of polling. ``unseen``
   probes never became visible; ``dropped`` sums the indexer's dropped events,
   gaps and resyncs. ``redis_cpu_share``, ``indexer_cpu_share``,
   ``publishers_cpu_share``: Redis's (with the probes' reads), the indexer's
   and the publisher processes' CPU time over the run, as shares of one core;
   on 2 cores the publishers take as much as the indexer.

    python -m bench.scale.scale_control --decisions 5000 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

from actors.sim.profile import GpuProfile
from bench.scale.control_seed import TENANTS, log, random_tokens, redis_usage, register_replicas, replica_names
from bench.scale.routing_heap import run_heap
from bench.scale.scale_indexer import run_indexer
from common.config import BatonConfig, RedisConfig
from common.processes import free_ports, redis_process
from common.stats import latency_summary
from deployments import gc_pauses
from routing.prefix import redis_index, redis_state
from routing.prefix.block_hash import hash_blocks

SYSTEM_TOKENS = 1024
IN_FLIGHT = 256  # requests the decisions keep started and not yet finished on the front
ACTIVE = 128  # conversations (of the pinned sessions) and new-session prompts the decisions cycle through
WARMUP = 300


def _config(redis_url: str, events_port: int, replicas: int, block_size: int) -> BatonConfig:
    return BatonConfig.model_validate({
        "colocated": True, "model": {"block_size": block_size}, "decode": {"replicas": replicas},
        "redis": {"url": redis_url, "start_local": False},
        "routing": {"events_port": events_port, "replica_timeout_s": 3600.0}})


def _seed_routing(client, names: list[str], sessions: int, ttl_s: float, rng: random.Random) -> None:
    """In-flight and queued work of every (replica, front) pair, and `sessions` pinned sessions."""
    fields = [redis_state.inflight_field(r, f) for r in names for f in names]
    client.hset(redis_state.inflight_key("decode"), mapping={k: rng.randint(0, 2) for k in fields})
    client.hset(redis_state.work_key("decode"), mapping={k: round(rng.uniform(0, 8), 2) for k in fields})
    now, pipe = time.time(), client.pipeline(transaction=False)
    for j in range(sessions):
        replica = names[j % len(names)]
        pipe.set(redis_state.pin_key("decode", f"s{j}"), replica, px=int(ttl_s * 1000))
        pipe.zadd(redis_state.sessions_key("decode", replica), {f"s{j}": now - rng.uniform(0, ttl_s / 2)})
        if j % 2000 == 1999:
            pipe.execute()
    pipe.execute()


def _seed_prompts(client, names: list[str], sessions: int, bs: int, rng: random.Random) -> tuple[list, list]:
    """Index of each tenant's system prompt (every replica) and of ACTIVE conversations'
    histories (their pinned replica); returns the pinned and the new-session work items."""
    index = redis_index.RedisIndex(client)
    systems = [random_tokens(rng, SYSTEM_TOKENS) for _ in range(TENANTS)]
    for t, sys_ids in enumerate(systems):
        hashes = hash_blocks(sys_ids, bs, f"t{t}")
        for n in names:
            index.apply_stored(n, hashes, None)
    pinned, fresh = [], []
    for k in range(ACTIVE):
        t, j = k % TENANTS, rng.randrange(sessions)
        history = systems[t] + random_tokens(rng, rng.randint(2048, 7680) - SYSTEM_TOKENS)
        index.apply_stored(names[j % len(names)], hash_blocks(history, bs, f"t{t}"), None)
        pinned.append(("pinned", history + random_tokens(rng, rng.randint(32, 320)), f"t{t}", f"s{j}"))
        fresh.append(("new", systems[t] + random_tokens(rng, rng.randint(1024, 7168)), f"t{t}", None))
    return pinned, fresh


def _mgets(client) -> int:
    """MGETs Redis ran so far: pin reads, one a decision while a front's copy loads (pin_feed.py)."""
    return int(client.info("commandstats").get("cmdstat_mget", {}).get("calls", 0))


async def _decide(routing, items: list, n: int, progress: bool, start: int = 0) -> dict:
    """Times `n` decisions, alternating pinned and new sessions (item `start` on)."""
    from time import perf_counter_ns

    lat: dict[str, list[int]] = {"pinned": [], "new": []}
    last, running = time.monotonic(), deque()
    for i in range(start, start + n):
        kind, ids, tenant, session = items[i % len(items)]
        session = session or f"n{i}"
        t0 = perf_counter_ns()
        route = await routing.route(ids, tenant, session)
        lat[kind].append(perf_counter_ns() - t0)
        routing.started(route)  # in flight, as a front's requests are: each decision sees counts move
        running.append(route)
        if len(running) > IN_FLIGHT:
            done = running.popleft()
            routing.computed(done)
            routing.finished(done)
        await asyncio.sleep(0)  # a front's loop runs its other tasks between requests: the writes, the view
        if time.monotonic() - last > 5:
            last = time.monotonic()
            log(progress, f"routing: {i + 1 - start}/{n} decisions")
    for done in running:
        routing.finished(done)
    while routing._pending:  # the pin and count writes it queued without waiting
        await asyncio.sleep(0.005)
    return lat


def _measure_routing(cfg: BatonConfig, names: list[str], items: list, decisions: int, progress: bool) -> dict:
    from deployments.front.metrics import IngressMetrics
    from deployments.front.request_routing import RequestRouting

    sync = cfg.redis.client()
    places, loaded, reads = [0], [0.0], [0]

    async def go() -> tuple[dict, int]:
        client = cfg.redis.client(asynchronous=True)
        routing = RequestRouting(cfg, client, IngressMetrics(), front=names[0])
        script = routing._place

        async def counted(*a, **kw):
            places[0] += 1
            return await script(*a, **kw)
        await _decide(routing, items, WARMUP, False)  # warm connections and caches
        t0 = time.monotonic()
        while routing.local is not None and (routing.local.index is None or not routing.pins.synced) \
                and time.monotonic() - t0 < 300:  # the front's copies of the index and the pins load from Redis
            await asyncio.sleep(0.05)  # (deployments/kv_index/index_feed.py, deployments/front/pin_feed.py)
        loaded[0] = time.monotonic() - t0
        routing._place = counted
        before, mgets = redis_usage(sync), _mgets(sync)
        lat = await _decide(routing, items, decisions, progress, WARMUP)
        after = redis_usage(sync)
        reads[0] = _mgets(sync) - mgets if routing.local is not None else decisions  # else one pipeline each
        await asyncio.gather(*(f.stop() for f in (routing.local, routing.pins) if f is not None))
        await client.aclose()
        return lat, (after[0] - before[0] - 2, after[1] - before[1])
    lat, (cmds, cpu_s) = asyncio.run(go())
    both = lat["pinned"] + lat["new"]
    s = latency_summary(both)
    return {"replicas": len(names), "decisions": len(both), "local_index": cfg.routing.local_index,
            "local_index_load_s": round(loaded[0], 2) if cfg.routing.local_index else None,
            "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"], "max_ms": s["max_ms"],
            "pinned": latency_summary(lat["pinned"]), "new_session": latency_summary(lat["new"]),
            "redis_cmds_per_decision": round(cmds / len(both), 1),
            "redis_cpu_us_per_decision": round(cpu_s * 1e6 / len(both), 1),
            "round_trips_per_decision": round((reads[0] + places[0]) / len(both), 2),
            "prompt_blocks_mean": round(sum(len(i[1]) // cfg.model.block_size for i in items) / len(items), 1)}


def run_routing(cfg: BatonConfig, replicas: int, sessions: int, decisions: int, progress: bool) -> dict:
    gc_pauses.space_out()  # the collector as a front's process runs it (deployments/replica.py)
    profile, rng = GpuProfile.load(), random.Random(7)
    names, sync = replica_names(replicas), cfg.redis.client()
    sync.flushall()
    register_replicas(sync, names, profile, rng)
    _seed_routing(sync, names, sessions, cfg.routing.pin_ttl_s, rng)
    log(progress, f"routing: {replicas} replicas, {sessions} pinned sessions registered; indexing prompts")
    pinned, fresh = _seed_prompts(sync, names, sessions, cfg.model.block_size, rng)
    items = [x for pair in zip(pinned, fresh) for x in pair]
    out = {**_measure_routing(cfg, names, items, decisions, progress), "sessions_pinned_at_start": sessions,
           "index_keys": sync.dbsize()}
    redis_cfg = cfg.model_copy(update={"routing": cfg.routing.model_copy(update={"local_index": False})})
    out["with_redis_index"] = _measure_routing(redis_cfg, names, items, max(200, decisions // 10), progress)
    return out


# ---- indexer lag: the publishing child process ----

def run(replicas: int = 64, sessions: int = 10_000, decisions: int = 20_000, seconds: float = 20.0,
        progress: bool = True, parts: tuple[str, ...] = ("routing", "indexer"), busy: float = 0.7,
        appendfsync: str = RedisConfig().appendfsync, publishers: int = 1, baseline: str | None = None) -> dict:
    """Both figures (see the module's docstring) against a redis-server of its own, which keeps its
    writes as `baton up`'s does (redis.appendfsync); the heap figure needs no Redis."""
    if parts == ("heap",):
        return {"heap": run_heap(replicas, sessions, progress, baseline)}
    host, (port, events_port) = "127.0.0.1", free_ports(2)
    bs = GpuProfile.load().block_size
    cfg = _config(f"redis://{host}:{port}/0", events_port, replicas, bs)
    with tempfile.TemporaryDirectory(prefix="baton-scale-") as tmp:
        server = redis_process(host, port, Path(tmp), Path(tmp) / "redis.log", appendfsync)
        server.start()
        try:
            server.wait_ready(15)
            out = {"block_size": bs, "appendfsync": appendfsync}
            if "routing" in parts:
                out["routing"] = run_routing(cfg, replicas, sessions, decisions, progress)
                log(progress, f"routing: {json.dumps(out['routing'])}")
            if "indexer" in parts:
                out["indexer"] = run_indexer(cfg, replicas, seconds, busy, progress, publishers)
            return out
        finally:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="baton bench scale --part control", description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=64, help="decode replicas, and simulated engines")
    ap.add_argument("--sessions", type=int, default=10_000, help="live pinned sessions")
    ap.add_argument("--decisions", type=int, default=20_000, help="timed routing decisions")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long the engines publish")
    ap.add_argument("--busy", type=float, default=0.7, help="share of each engine's time the chat load uses")
    ap.add_argument("--only", choices=("routing", "indexer", "heap"), help="one figure only (heap: the routing "
                    "state a front and the indexer keep at every engine's full KV, bench/scale/routing_heap.py)")
    ap.add_argument("--baseline", help="heap: a git revision whose index, pins, memo and translator to measure "
                    "beside this tree's (A B B A)")
    ap.add_argument("--appendfsync", choices=("always", "everysec", "off"), default=RedisConfig().appendfsync,
                    help="Redis's persistence (redis.appendfsync; default: `baton up`'s)")
    ap.add_argument("--publishers", type=int, default=1, help="processes the simulated engines' publishers share")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    a = ap.parse_args(argv)
    parts = (a.only,) if a.only else ("routing", "indexer")
    res = run(a.replicas, a.sessions, a.decisions, a.seconds, progress=not a.quiet, parts=parts, busy=a.busy,
              appendfsync=a.appendfsync, publishers=a.publishers, baseline=a.baseline)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
