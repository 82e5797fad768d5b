"""`baton bench scale --part control`'s heap figure: a front's copy of the KV index at every engine's
full KV, and what Python's cyclic collector pays for it.

Every front keeps the index in its memory (deployments/kv_index/index_feed.py). At 64 engines of
the profile's 27,903 blocks that is ~1.8M blocks. Each full collection traverses every container
the collector tracks, and it stops the front's event loop while it does (its requests, its
decisions). The figure builds such a copy as a front's feed would (chains of ~300 blocks after a
tenant's shared system prompt), then times one full collection, and counts the objects it
tracks and the process's resident memory. `--baseline FILE` runs a PrefixIndex from another
file (an older prefix_index.py, from `git show`) in the same run, for a before and after.
"""

from __future__ import annotations

import gc
import importlib.util
import random
import time

import psutil

from actors.sim.profile import GpuProfile
from bench.scale.control_seed import TENANTS, log, replica_names

CHAIN_BLOCKS = 300  # a conversation's blocks after its system prompt
HEAD_BLOCKS = 64  # a tenant's system prompt (1k tokens of 16)


def index_class(path: str | None):
    """The PrefixIndex class of `path` (a prefix_index.py), or this tree's."""
    if path is None:
        from routing.prefix.prefix_index import PrefixIndex

        return PrefixIndex
    spec = importlib.util.spec_from_file_location("baseline_prefix_index", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PrefixIndex


def measure(cls, replicas: int, blocks_per_replica: int, progress: bool) -> dict:
    """Builds an index of `replicas` x `blocks_per_replica` blocks and times a full collection."""
    rng = random.Random(5)
    heads = [[rng.getrandbits(64) for _ in range(HEAD_BLOCKS)] for _ in range(TENANTS)]
    gc.collect()
    me = psutil.Process()
    rss0, objects0 = me.memory_info().rss, len(gc.get_objects())
    index, t0, stored = cls(), time.perf_counter(), 0
    for i, name in enumerate(replica_names(replicas)):
        n = 0
        while n < blocks_per_replica:
            head = heads[rng.randrange(TENANTS)]
            chain = [rng.getrandbits(64) for _ in range(min(CHAIN_BLOCKS, blocks_per_replica - n))]
            index.apply_stored(name, head + chain)
            n += len(chain) + HEAD_BLOCKS
            stored += len(chain) + HEAD_BLOCKS
        if i % 16 == 15:
            log(progress, f"heap: {i + 1}/{replicas} replicas' blocks indexed")
    build_s = time.perf_counter() - t0
    pauses = []
    for _ in range(3):
        t0 = time.perf_counter()
        gc.collect()
        pauses.append((time.perf_counter() - t0) * 1000)
    out = {"replicas": replicas, "blocks_stored": stored, "apply_blocks_per_s": round(stored / build_s),
           "full_collection_ms": round(min(pauses), 1), "full_collection_max_ms": round(max(pauses), 1),
           "tracked_objects_added": len(gc.get_objects()) - objects0,
           "rss_added_mb": round((me.memory_info().rss - rss0) / 2**20)}
    del index
    gc.collect()
    return out


def run_heap(replicas: int, progress: bool, baseline: str | None = None) -> dict:
    """The heap figure for this tree's index and, with `baseline`, for the other's, in the order
    A B B A (each index is freed before the next is built)."""
    blocks = GpuProfile.load().num_gpu_blocks
    order = ["index", "baseline", "baseline", "index"] if baseline is not None else ["index"]
    out: dict = {"blocks_per_replica": blocks, "index": [], "baseline": []}
    for which in order:
        cls = index_class(baseline if which == "baseline" else None)
        out[which].append(measure(cls, replicas, blocks, progress))
        log(progress, f"heap: {which}: {out[which][-1]}")
    return out
