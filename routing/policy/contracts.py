"""Dataclasses at the router's boundary: request in, load in, decision out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

Reason = Literal["pinned", "moved", "prefix", "load"]


@dataclass(frozen=True)
class RoutingRequest:
    """What the router knows about one request before choosing a replica.

    ``block_hashes`` are the chained, tenant-salted hashes of the prompt's full
    blocks (see ``block_hash.hash_blocks``), or their leading part up to a block
    no replica holds (a front hashes no further: ``hash_memo.HashMemo.hashes``);
    ``prompt_blocks`` then counts them all (0: as many as ``block_hashes``). ``session`` comes from the
    ``x-session-affinity`` header. ``expected_decode_tokens`` is max_tokens or
    an estimate; the policy does not read it, the router shell adds it to its
    per-replica ``pending_blocks`` accounting once the request is sent.
    """

    block_hashes: tuple[int, ...]
    session: str | None = None
    expected_decode_tokens: int = 0
    prompt_blocks: int = 0

    @property
    def n_blocks(self) -> int:
        """Full blocks in the prompt."""
        return max(self.prompt_blocks, len(self.block_hashes))


@dataclass(slots=True)
class ReplicaLoad:
    """Load of one candidate replica as reported by it (or tracked by the router).

    Not frozen, unlike its neighbours: a front builds one per replica per decision, and a frozen
    dataclass's __init__ took 105 us of a 64-replica decision (slots: 34 us). A front keeps them
    between decisions and ages a waiting replica's ``oldest_wait_s`` in place
    (deployments/front/load_board.py); the policy changes none.

    ``pending_blocks`` is optional finer-grained work in flight: prefill
    blocks still to compute plus remaining decode tokens / block size. Engines
    do not report it; the router derives it from what it has sent and not yet
    seen finish (the simulator computes it exactly). When no replica reports
    it, load is ``running + queued``. ``oldest_wait_s`` is how long the
    oldest request the engine has not yet scheduled has waited (0 when none
    waits): the queue-wait half of the overload bound. ``sessions`` is how
    many live sessions are pinned to the replica (0 where nobody counts them):
    what places a new session, since each one's context will compete for the
    replica's KV cache turn after turn.

    The cost's inputs (routing/policy/cost.py): ``free_kv_blocks`` is what the
    replica can store without evicting anything cached;
    ``queued_prefill_blocks`` is the prefill work ahead on it in blocks (None:
    ``pending_blocks`` stands for it, as in the simulator);
    ``prefill_s_per_block`` and ``load_s_per_block`` are its engine's
    measured seconds per block computed and per block loaded from the shared
    tier (0 where it has not measured them yet: the policy's defaults apply).
    """

    running: int = 0
    queued: int = 0
    free_kv_blocks: int = 0
    capacity: int = 1
    alive: bool = True
    pending_blocks: float = 0.0
    oldest_wait_s: float = 0.0
    sessions: int = 0
    queued_prefill_blocks: float | None = None
    prefill_s_per_block: float = 0.0
    load_s_per_block: float = 0.0


@dataclass(frozen=True)
class RoutingDecision:
    """The chosen replica and why.

    ``reason``: "pinned" (session pin honoured), "moved" (the pin moved:
    another candidate costs less than staying, by the policy's margin),
    "prefix" (chosen for its cached prefix), or "load" (no useful cache;
    chosen for low load).
    ``cached_blocks`` is the leading run of the request's blocks the chosen
    replica holds per the index. ``repinned`` is True when a live session pin
    was moved to another replica by this decision. ``predicted_s`` is the
    request's predicted wait on the chosen replica (routing/policy/cost.py
    ``Cost.ttft_s``; None for a cold placement, which compares no costs) and
    ``stay_s`` the same on the pinned replica, where the session had a live
    pin.
    """

    replica: str
    reason: Reason
    cached_blocks: int = 0
    repinned: bool = False
    predicted_s: float | None = None
    stay_s: float | None = None


def loads_in_blocks(loads: dict[str, ReplicaLoad]) -> bool:
    """Whether `scalar_loads` counts blocks (some live replica reports
    ``pending_blocks``) rather than requests: the unit its thresholds take."""
    return any(l.pending_blocks > 0 for l in loads.values() if l.alive)


def scalar_loads(loads: dict[str, ReplicaLoad]) -> dict[str, float]:
    """One comparable number per live replica: work in flight in blocks when
    any replica reports ``pending_blocks``, else running + queued requests.
    Deciding the unit once per call keeps the numbers comparable."""
    if loads_in_blocks(loads):
        return {n: l.pending_blocks for n, l in loads.items() if l.alive}
    return {n: float(l.running + l.queued) for n, l in loads.items() if l.alive}


class Router(ABC):
    """A stateful router: a policy plus whatever state it keeps.

    Only ``route`` is abstract. The hooks default to no-ops; a router that keeps
    an index overrides the KV-event hooks, one that learns from its own
    history overrides ``on_routed``.
    """

    name: str = "router"

    @abstractmethod
    def route(self, request: RoutingRequest, loads: dict[str, ReplicaLoad], now: float) -> RoutingDecision:
        """Choose one of ``loads``' replicas for ``request``. May change router state."""

    def on_routed(self, request: RoutingRequest, replica: str, now: float) -> None:
        """The request was sent to ``replica``."""

    def on_kv_stored(self, replica: str, block_hashes: list[int], parent: int | None) -> None:
        """``replica`` reported new blocks (engine ``BlockStored``)."""

    def on_kv_removed(self, replica: str, block_hashes: list[int]) -> None:
        """``replica`` reported evicted blocks (engine ``BlockRemoved``)."""

    def on_replica_removed(self, replica: str) -> None:
        """``replica`` died or left the pool."""
