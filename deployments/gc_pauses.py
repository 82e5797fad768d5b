"""The cyclic garbage collector's pauses of a replica's process.

Each full collection traverses every object the collector tracks, and holds the
GIL, so the process's event loop (its requests, its routing decisions) stops
while it runs. Ray Serve freezes a replica's start-up heap once the replica is
up (`RAY_SERVE_FREEZE_GC_ON_STARTUP`, as `vllm serve` does with its own: vLLM,
torch, Ray and the app are ~756k objects, whose full collection took 321-326 ms
here), so what a full collection traverses is what came later: what requests
leave behind, and the KV index and pins a front keeps from their feeds, which
therefore hold no per-block or per-session object the collector tracks
(routing/prefix/prefix_index.py).

`space_out` has the youngest generation collected every YOUNG_THRESHOLD net allocations
instead of Python's 700. A front's request counts ~125 tracked objects towards it (net of frees), and at
each young collection the state of the requests in flight is still alive: it is
traversed and promoted, and every tenth collection traverses what was promoted.
At 200 req/s that was 0.08 ms of the collector a request (Baton's front; `vllm
serve`'s API server 0.045). With ten times fewer young collections (7,000 young
objects at most) a front went from 476-503 to 509-524 requests per CPU-second,
`vllm serve`'s 587-605 in the same rounds (docs/bench_scale.md). Every process
that serves vLLM's app calls it: the replica (deployments/replica.py) and a
catalogue model's own actor (deployments/catalogue/model_actor.py).

`watch` times every collection of the process; `drain` hands the pauses to
the front's metrics when they are read (`baton_gc_pause_seconds`; `baton bench
scale` reports the full ones at each rate). A full one that held the process
longer than LOG_FULL_S is logged. The callback touches no lock a Prometheus
metric takes: a collection can start inside one, on the same thread.
"""

from __future__ import annotations

import gc
import logging
import time
from collections import deque

logger = logging.getLogger(__name__)

LOG_FULL_S = 0.05  # a full collection held the process this long: a warning in the replica's log

YOUNG_THRESHOLD = 7000  # net allocations of tracked objects between young collections (Python: 700)
KEPT = 4096  # pauses kept until the next `drain`, the latest
_started: list[float] = []
_pauses: deque[tuple[int, float]] = deque(maxlen=KEPT)


def space_out() -> None:
    """Collects the youngest generation every YOUNG_THRESHOLD net allocations from now on; the
    older generations' thresholds stay Python's. Changes the process's `gc.get_threshold()`."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)


def watch() -> None:
    """Times every collection of this process from now on (once per process, however often it
    is called). Changes `gc.callbacks`."""
    if _timed not in gc.callbacks:
        gc.callbacks.append(_timed)


def drain() -> list[tuple[int, float]]:
    """(generation, seconds) of each collection since the last call (at most the last KEPT), oldest
    first; forgets them."""
    out = []
    while _pauses:
        out.append(_pauses.popleft())
    return out


def _timed(phase: str, info: dict) -> None:
    if phase == "start":
        _started[:] = [time.perf_counter()]
        return
    if not _started:
        return
    seconds = time.perf_counter() - _started[0]
    generation = info.get("generation", 0)
    _pauses.append((generation, seconds))
    if generation == 2 and seconds > LOG_FULL_S:
        logger.warning("a full garbage collection held this process %.0f ms (%d objects frozen before it)",
                       seconds * 1000, gc.get_freeze_count())
