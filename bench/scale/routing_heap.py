"""`baton bench scale --part control`'s heap figure: the routing state a front and the KV indexer keep
at 64 engines, and what Python's cyclic collector pays for it.

Every front keeps the KV index, every live session's pins and its hash memo in its memory
(deployments/kv_index/index_feed.py, deployments/front/pin_feed.py, routing/prefix/hash_memo.py);
the indexer keeps each engine's block map and the store's holdings (routing/prefix/event_translator.py).
At 64 engines of the profile's 27,903 blocks that is ~1.8M blocks. Ray Serve freezes a replica's
start-up heap, so each full collection traverses what came later, this state above all, and it
stops the process (a front's requests and decisions, the indexer's events) while it does. The
figure builds each state as the feeds would (chains of ~300 blocks after a tenant's shared system
prompt; `sessions` pins; the memo filled to its bound with agent turns; a third of each engine's
blocks saved to the store), changes it a little, as it changes all the time under load, then
times full collections, and counts the objects the collector tracks and the memory it added.
`--baseline REV` builds the same states with the classes as they were at git revision REV, in the
same run (A B B A).
"""

from __future__ import annotations

import gc
import importlib.util
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from actors.sim.profile import GpuProfile
from bench.scale.control_seed import TENANTS, VOCAB, log, replica_names
from common.constants import REPO_ROOT

CHAIN_BLOCKS = 300  # a conversation's blocks after its system prompt
HEAD_BLOCKS = 64  # a tenant's system prompt (1k tokens of 16)
MODULES = {"PrefixIndex": "prefix_index", "SessionPins": "session_pins", "HashMemo": "hash_memo",
           "EventTranslator": "event_translator"}


def state_classes(rev: str | None, tmp: Path) -> dict:
    """The index, pins, memo and translator classes of this tree, or as they were at git revision `rev`."""
    out = {}
    for name, module in MODULES.items():
        if rev is None:
            out[name] = getattr(importlib.import_module(f"routing.prefix.{module}"), name)
            continue
        path = tmp / f"{module}_{rev}.py"
        path.write_bytes(subprocess.run(["git", "show", f"{rev}:routing/prefix/{module}.py"], cwd=REPO_ROOT,
                                        check=True, capture_output=True).stdout)
        spec = importlib.util.spec_from_file_location(f"baseline_{module}", path)
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = loaded  # where its dataclasses look themselves up
        spec.loader.exec_module(loaded)
        out[name] = getattr(loaded, name)
    return out


def _fill(classes: dict, replicas: int, blocks_per_replica: int, sessions: int, progress: bool) -> tuple:
    rng, names = random.Random(5), replica_names(replicas)
    heads = [[rng.getrandbits(64) for _ in range(HEAD_BLOCKS)] for _ in range(TENANTS)]
    index, t0, stored = classes["PrefixIndex"](), time.perf_counter(), 0
    for i, name in enumerate(names):
        n = 0
        while n < blocks_per_replica:
            chain = [rng.getrandbits(64) for _ in range(min(CHAIN_BLOCKS, blocks_per_replica - n))]
            index.apply_stored(name, heads[rng.randrange(TENANTS)] + chain)
            n += len(chain) + HEAD_BLOCKS
            stored += len(chain) + HEAD_BLOCKS
        if i % 16 == 15:
            log(progress, f"heap: {i + 1}/{replicas} replicas' blocks indexed")
    build_s = time.perf_counter() - t0
    pins, now = classes["SessionPins"](600.0), time.time()
    for j in range(sessions):
        pins.put(f"session-{j}", names[j % replicas], now + rng.uniform(0, 600))
    memo, turn = classes["HashMemo"](16), 0
    while memo._bytes < 0.95 * memo.max_bytes:  # agent turns of ~5k tokens, to the memo's bound
        memo.hashes([rng.randrange(VOCAB) for _ in range(5000)], f"t{turn % TENANTS}", f"session-{turn}")
        turn += 1

    def change() -> None:
        index.apply_stored(names[0], [rng.getrandbits(64)])
        pins.put(f"session-{rng.randrange(sessions + 1)}", names[-1], now + 600)
    return (index, pins, memo), stored, build_s, change


def _fill_indexer(classes: dict, replicas: int, blocks_per_replica: int, progress: bool) -> tuple:
    rng, translator = random.Random(6), classes["EventTranslator"](16)
    tokens = [rng.randrange(VOCAB) for _ in range(CHAIN_BLOCKS * 16)]
    t0, stored, names = time.perf_counter(), 0, replica_names(replicas)

    def event(name: str, blocks: int, tenant: int) -> None:  # one BlockStored, a third saved to the store
        engine = [rng.getrandbits(63) for _ in range(blocks)]
        translator.stored(name, engine, None, tokens[:blocks * 16], [(f"t{tenant % TENANTS}",)])
        translator.store_stored(name, engine[:max(1, blocks // 3)])

    for i, name in enumerate(names):
        for k in range(-(-blocks_per_replica // CHAIN_BLOCKS)):
            event(name, CHAIN_BLOCKS, k)
            stored += CHAIN_BLOCKS
        if i % 16 == 15:
            log(progress, f"heap: {i + 1}/{replicas} engines' block maps kept")
    build_s = time.perf_counter() - t0
    return (translator,), stored, build_s, lambda: event(names[-1], 3, 0)


def measure(fill, replicas: int, progress: bool) -> dict:
    """Builds a state with `fill(progress)` (module docstring) and times full collections over it,
    changing it a little (`change`) after each."""
    gc.collect()
    me = psutil.Process()
    rss0, objects0 = me.memory_info().rss, len(gc.get_objects())
    state, stored, build_s, change = fill(progress)
    pauses = []
    for _ in range(3):
        t0 = time.perf_counter()
        gc.collect()
        pauses.append((time.perf_counter() - t0) * 1000)
        change()  # as the feeds change it between two collections
    out = {"replicas": replicas, "blocks": stored, "blocks_per_s": round(stored / build_s),
           "full_collection_ms": round(min(pauses), 1), "full_collection_max_ms": round(max(pauses), 1),
           "tracked_objects_added": len(gc.get_objects()) - objects0,
           "rss_added_mb": round((me.memory_info().rss - rss0) / 2**20)}
    del state
    gc.collect()
    return out


def run_heap(replicas: int, sessions: int, progress: bool, baseline: str | None = None) -> dict:
    """The heap figure, a front's state and the indexer's, for this tree's classes and, with
    `baseline` (a git revision), for that revision's, in the order A B B A (each state is freed
    before the next is built)."""
    blocks = GpuProfile.load().num_gpu_blocks
    out: dict = {"blocks_per_replica": blocks, "sessions": sessions, "baseline_rev": baseline,
                 "front": {"tree": [], "baseline": []}, "indexer": {"tree": [], "baseline": []}}
    order = ["tree", "baseline", "baseline", "tree"] if baseline is not None else ["tree"]
    with tempfile.TemporaryDirectory(prefix="baton-heap-") as tmp:
        for which in order:
            classes = state_classes(baseline if which == "baseline" else None, Path(tmp))
            for part, fill in (("front", lambda p: _fill(classes, replicas, blocks, sessions, p)),
                               ("indexer", lambda p: _fill_indexer(classes, replicas, blocks, p))):
                out[part][which].append(measure(fill, replicas, progress))
                log(progress, f"heap: {part}, {which}: {out[part][which][-1]}")
    return out
