"""Baton's control plane at scale, without engines or HTTP fronts.

Two figures, each on the real code and a real redis-server (started here, on
127.0.0.1, without persistence):

1. ``routing``: one routing decision is ``RequestRouting.route`` of
   deployments/front/request_routing.py, exactly what a front awaits per request:
   tenant-salted block hashing, what it reads from Redis (the pins, a new
   session's placement script and the index slice only without the front's
   copies, deployments/front/pin_feed.py and deployments/kv_index/index_feed.py;
   the registry and the fronts' counts only when its shared view is stale),
   the policy and the pin writes it queues without waiting. Redis holds
   ``replicas`` colocated replicas (each a front) with heartbeats, in-flight and
   queued-work fields for every (replica, front) pair, ``sessions`` pinned
   sessions, every tenant's system prompt indexed on every replica and active
   conversations on their pinned one. Half the decisions are a pinned session's
   next turn, half a new session. ``redis_cmds_per_decision``: INFO's commands
   delta (a script's count too); ``redis_cpu_us_per_decision``: Redis's own CPU
   time per decision. ``with_redis_index``: ``routing.local_index: false``.
2. ``indexer``: ``engines`` simulated engines publish vLLM KV events through
   vLLM's own ``ZmqEventPublisher`` (one per engine, topic = replica, with a
   replay socket) from a child process, to the real KV indexer
   (``deployments/kv_index/kv_indexer.EventLoop``, its Serve wrapper aside). Each
   engine steps every ``step_ms`` and per step stores the blocks a chat
   workload at 70% of an H100 would (``engine_rates``: GpuProfile prefill and
   decode times; 1k new prompt tokens and 256 output tokens per request at
   4k context, 64 sequences decoding), as one new chain (BlockStored, salt in
   its first block's extra keys), and evicts as many old blocks (BlockRemoved)
   once it holds ``WINDOW_BLOCKS``. A probe thread polls, every millisecond,
   the same Redis read a front makes (``queue_snapshot``) for sampled chains'
   last block until the index names the engine: ``lag_*_ms`` is from the
   batch's publish call to that, so it includes up to ~1 ms of polling.
   ``unseen`` probes never became visible; ``dropped`` sums the indexer's
   dropped events, gaps and resyncs. ``redis_cpu_share``, ``indexer_cpu_share``: Redis's and the
   indexer's CPU time over the run, as shares of one core (Redis's with the probes' reads).

    python -m bench.scale.scale_control --decisions 5000 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

from actors.sim.profile import GpuProfile, engine_rates
from common.config import BatonConfig, RedisConfig
from common.processes import free_ports, redis_process
from common.stats import latency_summary, percentile
from routing.prefix import redis_state
from routing.prefix.block_hash import hash_blocks

TENANTS = 8
SYSTEM_TOKENS = 1024
ACTIVE = 128  # conversations (of the pinned sessions) and new-session prompts the decisions cycle through
WARMUP = 300
WINDOW_BLOCKS = 2048  # blocks an engine holds in the index before it evicts
PROBE_EVERY = 4  # one probe per this many batches of an engine
VOCAB = 128_000


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(f"[bench scale control] {msg}", file=sys.stderr, flush=True)


def _config(redis_url: str, events_port: int, replicas: int, block_size: int) -> BatonConfig:
    return BatonConfig.model_validate({
        "colocated": True, "model": {"block_size": block_size}, "decode": {"replicas": replicas},
        "redis": {"url": redis_url, "start_local": False},
        "routing": {"events_port": events_port, "replica_timeout_s": 3600.0}})


def _names(n: int, prefix: str = "r") -> list[str]:
    return [f"{prefix}{i:03d}" for i in range(n)]


def _register(client, names: list[str], profile: GpuProfile, rng: random.Random, replay: dict | None = None) -> None:
    """Heartbeat entries for `names` in the decode pool (sync client)."""
    now = time.time()
    entries = {}
    for i, n in enumerate(names):
        free = rng.randint(0, profile.num_gpu_blocks // 4)
        waiting = rng.random() < 0.2
        entries[n] = json.dumps({
            "capacity_blocks": profile.num_gpu_blocks, "kv_blocks": profile.num_gpu_blocks,
            "kv_free_blocks": free + rng.randint(0, 2000), "kv_empty_blocks": free,
            "running": rng.randint(20, 60), "waiting": int(waiting) * rng.randint(1, 4),
            "oldest_wait_s": round(rng.uniform(0, 0.5), 3) if waiting else 0.0, "unfinished": rng.randint(20, 64),
            "prefill_s_per_token": 2.6e-5, "load_s_per_token": 1.5e-6, "url": f"http://10.0.{i // 200}.{i % 200}:8001",
            **({"events_replay": replay[n]} if replay else {}), "ts": now})
    client.hset(redis_state.registry_key("decode"), mapping=entries)


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


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def _seed_prompts(client, names: list[str], sessions: int, bs: int, rng: random.Random) -> tuple[list, list]:
    """Index of each tenant's system prompt (every replica) and of ACTIVE conversations'
    histories (their pinned replica); returns the pinned and the new-session work items."""
    index = redis_state.RedisIndex(client)
    systems = [_tokens(rng, SYSTEM_TOKENS) for _ in range(TENANTS)]
    for t, sys_ids in enumerate(systems):
        hashes = hash_blocks(sys_ids, bs, f"t{t}")
        for n in names:
            index.apply_stored(n, hashes, None)
    pinned, fresh = [], []
    for k in range(ACTIVE):
        t, j = k % TENANTS, rng.randrange(sessions)
        history = systems[t] + _tokens(rng, rng.randint(2048, 7680) - SYSTEM_TOKENS)
        index.apply_stored(names[j % len(names)], hash_blocks(history, bs, f"t{t}"), None)
        pinned.append(("pinned", history + _tokens(rng, rng.randint(32, 320)), f"t{t}", f"s{j}"))
        fresh.append(("new", systems[t] + _tokens(rng, rng.randint(1024, 7168)), f"t{t}", None))
    return pinned, fresh


def _mgets(client) -> int:
    """MGETs Redis ran so far: pin reads, one a decision while a front's copy loads (pin_feed.py)."""
    return int(client.info("commandstats").get("cmdstat_mget", {}).get("calls", 0))


def _usage(client) -> tuple[int, float]:
    """(commands processed, CPU seconds used) by the Redis server so far, from INFO."""
    info = client.info()
    return int(info["total_commands_processed"]), float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _decide(routing, items: list, n: int, progress: bool, start: int = 0) -> dict:
    """Times `n` decisions, alternating pinned and new sessions (item `start` on)."""
    from time import perf_counter_ns

    lat: dict[str, list[int]] = {"pinned": [], "new": []}
    last = time.monotonic()
    for i in range(start, start + n):
        kind, ids, tenant, session = items[i % len(items)]
        session = session or f"n{i}"
        t0 = perf_counter_ns()
        await routing.route(ids, tenant, session)
        lat[kind].append(perf_counter_ns() - t0)
        await asyncio.sleep(0)  # a front's loop runs its other tasks between requests: the writes, the view
        if time.monotonic() - last > 5:
            last = time.monotonic()
            _log(progress, f"routing: {i + 1 - start}/{n} decisions")
    while routing._pending:  # the pin writes it queued without waiting
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
        before, mgets = _usage(sync), _mgets(sync)
        lat = await _decide(routing, items, decisions, progress, WARMUP)
        after = _usage(sync)
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
    profile, rng = GpuProfile.load(), random.Random(7)
    names, sync = _names(replicas), cfg.redis.client()
    sync.flushall()
    _register(sync, names, profile, rng)
    _seed_routing(sync, names, sessions, cfg.routing.pin_ttl_s, rng)
    _log(progress, f"routing: {replicas} replicas, {sessions} pinned sessions registered; indexing prompts")
    pinned, fresh = _seed_prompts(sync, names, sessions, cfg.model.block_size, rng)
    items = [x for pair in zip(pinned, fresh) for x in pair]
    out = {**_measure_routing(cfg, names, items, decisions, progress), "sessions_pinned_at_start": sessions,
           "index_keys": sync.dbsize()}
    redis_cfg = cfg.model_copy(update={"routing": cfg.routing.model_copy(update={"local_index": False})})
    out["with_redis_index"] = _measure_routing(redis_cfg, names, items, max(200, decisions // 10), progress)
    return out


# ---- indexer lag: the publishing child process ----

def _batch(state: dict, k: int, bs: int, salt: str, tokens: list[int]):
    """One engine step: a new chain of `k` blocks, and evictions past WINDOW_BLOCKS."""
    from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

    state["chains"] += 1
    ids = [state["chains"]] + tokens[1:k * bs]  # a first token of its own: a chain no other starts
    engine = list(range(state["next"], state["next"] + k))
    state["next"] += k
    state["held"].extend(engine)
    events = [BlockStored(block_hashes=engine, parent_block_hash=None, token_ids=ids, block_size=bs,
                          lora_id=None, medium="GPU", lora_name=None, extra_keys=[(salt,)] + [None] * (k - 1))]
    old = [state["held"].popleft() for _ in range(max(0, len(state["held"]) - WINDOW_BLOCKS))]
    if old:
        events.append(BlockRemoved(block_hashes=old, medium="GPU"))
    return KVEventBatch(ts=time.time(), events=events), ids, len(old)


def _probe(client, pending: collections.deque, lags: list, done: threading.Event) -> None:
    """Polls, every millisecond, whether routing's index read sees each pending (ts, replica, hash)."""
    waiting: list = []
    while not (done.is_set() and not waiting and not pending):
        while pending:
            waiting.append(pending.popleft())
        if waiting:
            pipe = client.pipeline(transaction=False)
            for _, _, h in waiting:
                redis_state.queue_snapshot(pipe, [h])
            res, now = pipe.execute(), time.time()
            seen = [redis_state.snapshot_from([w[2]], res[2 * i:2 * i + 2]).match([w[2]]).get(w[1], 0) > 0
                    for i, w in enumerate(waiting)]
            lags.extend((now - w[0]) * 1000 for w, s in zip(waiting, seen) if s)
            waiting = [w for w, s in zip(waiting, seen) if not s and now - w[0] < 20]
        time.sleep(0.001)


def _publisher_main(spec: dict, out) -> None:
    """Child process: spec['engines'] vLLM publishers stepping for spec['seconds']; puts its counts in `out`."""
    import redis
    from vllm.distributed.kv_events import ZmqEventPublisher

    bs, step, names = spec["block_size"], spec["step_ms"] / 1000, spec["names"]
    pubs = [ZmqEventPublisher(0, endpoint=spec["endpoint"], replay_endpoint=spec["replay"][n], topic=n)
            for n in names]
    rng, tokens = random.Random(11), _tokens(random.Random(12), 4096)
    state = {n: {"chains": 0, "next": 1 + i * 10**12, "held": collections.deque()} for i, n in enumerate(names)}
    credit = {n: rng.random() for n in names}
    pending, lags, done = collections.deque(), [], threading.Event()
    prober = threading.Thread(target=_probe, args=(redis.Redis.from_url(spec["redis"]), pending, lags, done))
    prober.start()
    time.sleep(1.0)  # PUB->SUB connections settle
    t0, counts, beat = time.monotonic(), collections.Counter(), 0
    phase = {n: step * i / len(names) for i, n in enumerate(names)}
    while (now := time.monotonic() - t0) < spec["seconds"]:
        for n, pub in zip(names, pubs):
            due = phase[n] + step * (counts[n] + 1)
            if due > now:
                continue
            credit[n] += spec["blocks_per_s"] * step
            k = int(credit[n])
            if k == 0:
                counts[n] += 1
                continue
            credit[n] -= k
            salt = f"t{counts[n] % TENANTS}"
            batch, ids, removed = _batch(state[n], k, bs, salt, tokens)
            pub.publish(batch)
            counts.update({n: 1, "stored": k, "removed": removed, "events": len(batch.events)})
            if counts[n] % PROBE_EVERY == 0:
                pending.append((batch.ts, n, hash_blocks(ids, bs, salt)[-1]))
        time.sleep(max(0.0, min(phase[n] + step * (counts[n] + 1) for n in names) - (time.monotonic() - t0)))
    elapsed = time.monotonic() - t0
    done.set()
    prober.join(30)
    for p in pubs:
        p.shutdown()
    out.put({"seconds": elapsed, "events": counts["events"], "stored": counts["stored"],
             "removed": counts["removed"], "lags_ms": lags, "probes": len(lags) + len(pending)})


def run_indexer(cfg: BatonConfig, engines: int, seconds: float, busy: float, progress: bool) -> dict:
    from deployments.kv_index.kv_indexer import EventLoop

    profile = GpuProfile.load()
    rates = engine_rates(profile, busy)
    names, sync = _names(engines, "e"), cfg.redis.client()
    sync.flushall()
    replay = {n: f"tcp://127.0.0.1:{p}" for n, p in zip(names, free_ports(engines))}
    _register(sync, names, profile, random.Random(3), replay)
    loop = EventLoop(cfg)
    spec = {"names": names, "block_size": cfg.model.block_size, "step_ms": rates["step_ms"], "seconds": seconds,
            "blocks_per_s": rates["blocks_per_s"], "redis": cfg.redis.url, "replay": replay,
            "endpoint": f"tcp://{cfg.routing.events_host}:{cfg.routing.events_port}"}
    _log(progress, f"indexer: {engines} engines x {rates['blocks_per_s']} blocks/s for {seconds:.0f}s")
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_publisher_main, args=(spec, out), daemon=True)
    child.start()
    before, cpu0 = _usage(sync), time.process_time()  # this process's CPU: the indexer's thread
    try:
        res = out.get(timeout=seconds + 120)
        redis_s, indexer_s = _usage(sync)[1] - before[1], time.process_time() - cpu0
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
        loop.stop()
        loop.thread.join(5)
        loop.sock.close(linger=0)
    totals = loop.totals()
    lags = sorted(res["lags_ms"])
    return {"engines": engines, "profile": profile.name, "busy": busy, "per_engine": rates,
            **{f"{name}_per_s": round(res[key] / res["seconds"], 1) for name, key in
               (("events", "events"), ("blocks_stored", "stored"), ("blocks_removed", "removed"))},
            "probes": res["probes"], "unseen": res["probes"] - len(lags),
            **{f"lag_{q}_ms": round(percentile(lags, n), 2) if lags else None for q, n in (("p50", 50), ("p99", 99))},
            "lag_max_ms": round(lags[-1], 2) if lags else None,
            "dropped": totals["dropped_events"] + totals["gaps"] + totals["resyncs"], "indexer_totals": totals,
            "redis_cpu_share": round(redis_s / res["seconds"], 3),
            "indexer_cpu_share": round(indexer_s / res["seconds"], 3)}


def run(replicas: int = 64, sessions: int = 10_000, decisions: int = 20_000, seconds: float = 20.0,
        progress: bool = True, parts: tuple[str, ...] = ("routing", "indexer"), busy: float = 0.7,
        appendfsync: str = RedisConfig().appendfsync) -> dict:
    """Both figures (see the module's docstring) against a redis-server of its own, which keeps its
    writes as `baton up`'s does (redis.appendfsync)."""
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
                _log(progress, f"routing: {json.dumps(out['routing'])}")
            if "indexer" in parts:
                out["indexer"] = run_indexer(cfg, replicas, seconds, busy, progress)
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
    ap.add_argument("--only", choices=("routing", "indexer"), help="one figure only")
    ap.add_argument("--appendfsync", choices=("always", "everysec", "off"), default=RedisConfig().appendfsync,
                    help="Redis's persistence (redis.appendfsync; default: `baton up`'s)")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    a = ap.parse_args(argv)
    parts = (a.only,) if a.only else ("routing", "indexer")
    res = run(a.replicas, a.sessions, a.decisions, a.seconds, progress=not a.quiet, parts=parts, busy=a.busy,
              appendfsync=a.appendfsync)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
