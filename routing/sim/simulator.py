"""Trace replay against a simulated pool of replicas.

Every request of the trace goes through a real ``Router`` (Baton's policy
with its prefix index and pins, or a baseline). The chosen replica then
"serves" it:

- KV: each replica owns an ``LRUBlockCache`` of ``capacity`` trace blocks. The
  request hits the leading run of its blocks that the replica holds (prefix
  caching); afterwards the replica holds all its blocks, most recently used.
  New blocks and evictions go back to the router as KV events, exactly as an
  engine would publish ``BlockStored``/``BlockRemoved``. KV is stored at
  arrival (the index is never stale), a simplification: a real engine
  publishes after the prefill step, a few hundred ms later.
- Time: service-time model, per replica (defaults in ``ServiceModel``):
  prefill is one FIFO server computing ``prefill_blocks_per_s`` uncached
  blocks per second (cached blocks are free); decode runs batched, each
  request producing ``decode_tokens_per_s`` tokens per second independently
  of the others (decode is memory-bound, so batching hides it). A request is
  *queued* while waiting for the prefill server and *running* from the start
  of its prefill to its last token. ``pending_blocks`` = prefill work still
  queued plus remaining decode tokens / 512. At the default 10 blocks/s the
  prefill servers are about 75% busy at Baton's hit ratio (94% under round
  robin); at 7 blocks/s the pool is overloaded (about 107%) and queues grow.
- Work: a replica's work is its uncached prefill blocks plus output tokens /
  512 (one block = 512 tokens, the trace's block size). ``imbalance`` is
  max/mean of per-replica work over the whole replay.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from routing.policy.contracts import ReplicaLoad, Router, RoutingRequest
from routing.prefix.lru_cache import LRUBlockCache
from common.constants import TRACE_BLOCK_TOKENS
from routing.sim.trace import TraceRequest


@dataclass(frozen=True)
class ServiceModel:
    """Service-time model of one replica; see the module docstring."""

    prefill_blocks_per_s: float = 10.0
    decode_tokens_per_s: float = 40.0
    tokens_per_block: int = TRACE_BLOCK_TOKENS


@dataclass
class _InFlight:
    prefill_start: float
    prefill_end: float
    done: float
    output_tokens: int


class SimReplica:
    """One simulated replica: an LRU KV cache plus a service-time model."""

    def __init__(self, name: str, capacity: int, model: ServiceModel) -> None:
        self.name = name
        self.cache = LRUBlockCache(capacity)
        self.model = model
        self.alive = True
        self.work = 0.0
        self.hit_blocks = 0
        self.total_blocks = 0
        self.requests = 0
        self._prefill_free_at = 0.0
        self._inflight: list[_InFlight] = []

    def load(self, now: float) -> ReplicaLoad:
        """Load at ``now``. Changes: forgets requests finished by ``now``."""
        self._inflight = [r for r in self._inflight if r.done > now]
        running = sum(1 for r in self._inflight if r.prefill_start <= now)
        queued = len(self._inflight) - running
        pending = max(0.0, self._prefill_free_at - now) * self.model.prefill_blocks_per_s
        for r in self._inflight:
            decode_left = min(r.done - r.prefill_end, r.done - now) * self.model.decode_tokens_per_s
            pending += decode_left / self.model.tokens_per_block
        return ReplicaLoad(
            running=running,
            queued=queued,
            free_kv_blocks=self.cache.free,
            capacity=self.cache.capacity,
            alive=self.alive,
            pending_blocks=pending,
            prefill_s_per_block=1.0 / self.model.prefill_blocks_per_s,
        )

    def serve(self, req: TraceRequest, now: float) -> tuple[int, list[int], list[int]]:
        """Serve ``req`` arriving at ``now``: returns ``(hit_blocks, stored, evicted)``.

        Changes the cache, the work counters and the service queue.
        """
        hits = self.cache.prefix_hits(req.block_hashes)
        stored, evicted = self.cache.insert(req.block_hashes)
        uncached = len(req.block_hashes) - hits
        start = max(now, self._prefill_free_at)
        prefill_end = start + uncached / self.model.prefill_blocks_per_s
        self._prefill_free_at = prefill_end
        done = prefill_end + req.output_length / self.model.decode_tokens_per_s
        self._inflight.append(_InFlight(start, prefill_end, done, req.output_length))
        self.work += uncached + req.output_length / self.model.tokens_per_block
        self.hit_blocks += hits
        self.total_blocks += len(req.block_hashes)
        self.requests += 1
        return hits, stored, evicted


@dataclass(frozen=True)
class PoolEvent:
    """Change to the pool at ``at_s``: ``add`` a new empty replica, or
    ``remove`` one (it dies: its KV is lost and the router is told)."""

    at_s: float
    action: str
    replica: str


@dataclass
class SimResult:
    """Outcome of one replay."""

    policy: str
    hit_ratio: float
    imbalance: float
    work: dict[str, float]
    requests: dict[str, int]
    reasons: Counter = field(default_factory=Counter)
    repins: int = 0
    latencies_us: list[float] = field(default_factory=list)
    held_blocks: dict[str, int] = field(default_factory=dict)


def simulate(
    trace: list[TraceRequest],
    router: Router,
    replicas: int = 8,
    capacity: int = 2000,
    model: ServiceModel | None = None,
    session_of: Callable[[int, TraceRequest], str | None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    pool_events: Sequence[PoolEvent] = (),
) -> SimResult:
    """Replay ``trace`` through ``router`` over ``replicas`` simulated replicas
    named r0, r1, ...

    ``session_of(i, request)`` may attach a session id to each request;
    ``pool_events`` add or kill replicas during the replay. Changes ``router``
    (it receives every routing decision, KV event and replica removal).
    """
    model = model or ServiceModel()
    pool = {f"r{i}": SimReplica(f"r{i}", capacity, model) for i in range(replicas)}
    reasons: Counter = Counter()
    latencies: list[float] = []
    repins = 0
    events = sorted(pool_events, key=lambda e: e.at_s)
    n = len(trace)
    for i, req in enumerate(trace):
        now = req.arrival_s
        while events and events[0].at_s <= now:
            _apply_event(events.pop(0), pool, router, capacity, model)
        loads = {name: rep.load(now) for name, rep in pool.items() if rep.alive}
        session = session_of(i, req) if session_of else None
        rreq = RoutingRequest(req.block_hashes, session, req.output_length)
        t0 = time.perf_counter()
        decision = router.route(rreq, loads, now)
        latencies.append((time.perf_counter() - t0) * 1e6)
        router.on_routed(rreq, decision.replica, now)
        reasons[decision.reason] += 1
        repins += decision.repinned
        _, stored, evicted = pool[decision.replica].serve(req, now)
        for parent, run in _contiguous_runs(req.block_hashes, stored):
            router.on_kv_stored(decision.replica, run, parent)
        if evicted:
            router.on_kv_removed(decision.replica, evicted)
        if progress is not None:
            progress(i + 1, n)
    total = sum(r.total_blocks for r in pool.values())
    hits = sum(r.hit_blocks for r in pool.values())
    work = {name: r.work for name, r in pool.items()}
    mean = sum(work.values()) / len(work)
    return SimResult(
        policy=getattr(router, "name", type(router).__name__),
        hit_ratio=hits / total if total else 0.0,
        imbalance=max(work.values()) / mean if mean > 0 else 1.0,
        work=work,
        requests={name: r.requests for name, r in pool.items()},
        reasons=reasons,
        repins=repins,
        latencies_us=latencies,
        held_blocks={name: len(r.cache) for name, r in pool.items()},
    )


def _contiguous_runs(chain: Sequence[int], stored: list[int]) -> list[tuple[int | None, list[int]]]:
    """Split ``stored`` (a subsequence of ``chain``) into consecutive runs with
    their parent hash: one ``BlockStored`` event per run, as an engine sends."""
    if not stored:
        return []
    new = set(stored)
    runs: list[tuple[int | None, list[int]]] = []
    parent: int | None = None
    for h in chain:
        if h in new:
            if runs and runs[-1][1] and runs[-1][1][-1] == parent:
                runs[-1][1].append(h)
            else:
                runs.append((parent, [h]))
        parent = h
    return runs


def _apply_event(
    event: PoolEvent, pool: dict[str, SimReplica], router: Router, capacity: int, model: ServiceModel
) -> None:
    if event.action == "add":
        pool[event.replica] = SimReplica(event.replica, capacity, model)
    elif event.action == "remove":
        rep = pool[event.replica]
        rep.alive = False
        rep.cache.clear()
        router.on_replica_removed(event.replica)
    else:
        raise ValueError(f"unknown pool event {event.action!r}")


def single_cache_hit_ratio(trace: Iterable[TraceRequest], capacity: int | None) -> float:
    """Block-weighted prefix hit ratio of one LRU cache of ``capacity`` blocks
    serving every request (None = unbounded). The reference bounds."""
    cache = LRUBlockCache(capacity) if capacity is not None else None
    seen: set[int] = set()
    hits = total = 0
    for req in trace:
        total += len(req.block_hashes)
        if cache is None:
            for h in req.block_hashes:
                if h not in seen:
                    break
                hits += 1
            seen.update(req.block_hashes)
        else:
            hits += cache.prefix_hits(req.block_hashes)
            cache.insert(req.block_hashes)
    return hits / total if total else 0.0
