"""`baton bench scale --part control`'s indexer figure: simulated engines publish vLLM KV events
at their profiled rate to the real KV indexer, and a prober times until routing's read sees them
(the figure is described in bench/scale/scale_control.py's docstring)."""

from __future__ import annotations

import collections
import gc
import multiprocessing
import random
import time

from actors.sim.profile import GpuProfile, engine_rates
from bench.scale.control_seed import TENANTS, log, random_tokens, redis_usage, register_replicas, replica_names
from common.config import BatonConfig
from common.processes import free_ports
from common.stats import percentile
from routing.prefix import redis_index
from routing.prefix.block_hash import hash_blocks

WINDOW_BLOCKS = 2048  # blocks an engine holds in the index before it evicts
PROBE_EVERY = 4  # one probe per this many batches of an engine


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


def _prober_main(url: str, publishers: int, probes, out) -> None:
    """Child process: polls, every millisecond, whether routing's index read sees each (ts, replica,
    hash) the publishers send on `probes`, until all `publishers` have said they ended (None); puts
    the lags (ms) and the number of probes in `out`. A process of its own, so that its reads do
    not wait for the publishers' threads' GIL, nor the indexer's."""
    import queue

    import redis

    client, waiting, lags, probes_n, ended = redis.Redis.from_url(url), [], [], 0, 0
    while ended < publishers or waiting:
        try:
            while True:
                item = probes.get_nowait()
                if item is None:
                    ended += 1
                else:
                    waiting.append(item)
                    probes_n += 1
        except queue.Empty:
            pass
        if waiting:
            pipe = client.pipeline(transaction=False)
            for _, _, h in waiting:
                redis_index.queue_snapshot(pipe, [h])
            res, now = pipe.execute(), time.time()
            seen = [redis_index.snapshot_from([w[2]], res[2 * i:2 * i + 2]).match([w[2]]).get(w[1], 0) > 0
                    for i, w in enumerate(waiting)]
            lags.extend((now - w[0]) * 1000 for w, s in zip(waiting, seen) if s)
            waiting = [w for w, s in zip(waiting, seen) if not s and now - w[0] < 20]
        time.sleep(0.001)
    out.put({"lags_ms": lags, "probes": probes_n})


def _publisher_main(spec: dict, start, probes, out) -> None:
    """Child process: the vLLM publishers of spec['names'] stepping for spec['seconds']; sends
    sampled chains to the prober on `probes` (None when it ends) and puts its counts in `out`;
    starts once every publisher process reaches `start` (a barrier)."""
    from vllm.distributed.kv_events import ZmqEventPublisher

    bs, step, names = spec["block_size"], spec["step_ms"] / 1000, spec["names"]
    pubs = [ZmqEventPublisher(0, endpoint=spec["endpoint"], replay_endpoint=spec["replay"][n], topic=n)
            for n in names]
    rng, tokens = random.Random(11 + spec["index"][0]), random_tokens(random.Random(12), 4096)
    state = {n: {"chains": 0, "next": 1 + i * 10**12, "held": collections.deque()} for i, n in zip(spec["index"], names)}
    credit = {n: rng.random() for n in names}
    time.sleep(1.0)  # PUB->SUB connections settle
    start.wait(120)  # every publisher process imported and connected
    t0, cpu0, counts = time.time(), time.process_time(), collections.Counter()
    phase = {n: step * i / spec["engines"] for i, n in zip(spec["index"], names)}
    while (now := time.time() - t0) < spec["seconds"]:
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
                probes.put((batch.ts, n, hash_blocks(ids, bs, salt)[-1]))
        time.sleep(max(0.0, min(phase[n] + step * (counts[n] + 1) for n in names) - (time.time() - t0)))
    elapsed, cpu = time.time() - t0, time.process_time() - cpu0
    for p in pubs:
        p.shutdown()
    probes.put(None)
    out.put({"seconds": elapsed, "cpu_s": cpu, "events": counts["events"], "stored": counts["stored"], "removed": counts["removed"]})


def run_indexer(cfg: BatonConfig, engines: int, seconds: float, busy: float, progress: bool,
                publishers: int = 1) -> dict:
    from deployments.kv_index.kv_indexer import EventLoop

    profile = GpuProfile.load()
    rates = engine_rates(profile, busy)
    names, sync = replica_names(engines, "e"), cfg.redis.client()
    sync.flushall()
    replay = {n: f"tcp://127.0.0.1:{p}" for n, p in zip(names, free_ports(engines))}
    register_replicas(sync, names, profile, random.Random(3), replay)
    loop = EventLoop(cfg)
    parts = max(1, min(publishers, engines))
    log(progress, f"indexer: {engines} engines x {rates['blocks_per_s']} blocks/s for {seconds:.0f}s"
                   f" ({parts} publisher processes)")
    ctx = multiprocessing.get_context("spawn")
    out, probes, done = ctx.Queue(), ctx.Queue(), ctx.Queue()
    start = ctx.Barrier(parts)
    children = [ctx.Process(target=_prober_main, args=(cfg.redis.url, parts, probes, done), daemon=True)]
    for part in range(parts):
        spec = {"names": names[part::parts], "index": list(range(part, engines, parts)), "engines": engines,
                "block_size": cfg.model.block_size, "step_ms": rates["step_ms"], "seconds": seconds,
                "blocks_per_s": rates["blocks_per_s"], "replay": replay,
                "endpoint": f"tcp://{cfg.routing.events_host}:{cfg.routing.events_port}"}
        children.append(ctx.Process(target=_publisher_main, args=(spec, start, probes, out), daemon=True))
    for child in children:
        child.start()
    # As Ray Serve does once the indexer's replica is up (RAY_SERVE_FREEZE_GC_ON_STARTUP): what this
    # process holds now, the bench's own included, is out of the collector's later full collections.
    gc.collect()
    gc.freeze()
    before, cpu0 = redis_usage(sync), time.process_time()  # this process's CPU: the indexer's thread
    try:
        got = [out.get(timeout=seconds + 120) for _ in range(parts)]
        redis_s, indexer_s = redis_usage(sync)[1] - before[1], time.process_time() - cpu0
        res = {k: sum(g[k] for g in got) for k in ("events", "stored", "removed", "cpu_s")}
        res["seconds"] = max(g["seconds"] for g in got)
        res.update(done.get(timeout=60))
    finally:
        for child in children:
            child.join(30)
            if child.is_alive():
                child.kill()
        loop.stop()
        loop.thread.join(5)
        loop.sock.close(linger=0)
        gc.unfreeze()
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
            "indexer_cpu_share": round(indexer_s / res["seconds"], 3),
            "publishers": parts, "publishers_cpu_share": round(res["cpu_s"] / res["seconds"], 3)}

