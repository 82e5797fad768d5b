"""What one routing decision reads (`Reads`) and decides (`Route`), deployments/front/request_routing.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from routing.prefix.prefix_index import IndexSnapshot


@dataclass
class Route:
    """Where one request goes and what the index predicted for it."""

    decode_replica: str | None
    prefill_replica: str | None
    decode_only: bool
    reason: str  # pinned | moved | prefix | load | round_robin | no_replicas | fallback
    predicted_cached_tokens: int  # on the replica that computes the prompt
    repinned: bool = False
    prompt_blocks: int = 0
    in_flight: set = field(default_factory=set)  # pools this request still occupies
    decode_url: str | None = None  # internal servers of the chosen replicas, from the registry
    prefill_url: str | None = None
    # Whether the index says the store holds more of the prompt than the prefill engine's own cache.
    prefill_lookup: bool = True
    work: dict = field(default_factory=dict)  # pool -> prefill blocks this request adds to its replica's queue
    # The cost's predicted wait (routing/policy/cost.py), summed over the pools the request uses: on the
    # chosen replicas, and on the session's pinned ones (the chosen where it had none); None
    # where a pool placed it cold, which compares no costs. `moved`: pools whose pin moved.
    predicted_s: float | None = None
    stay_s: float | None = None
    moved: list = field(default_factory=list)


@dataclass
class Reads:
    """What one decision reads, from Redis or from this front's copies."""

    snap: IndexSnapshot
    live: dict[str, dict[str, dict]]  # pool -> replica -> registry entry
    pins: dict[str, str | None]  # pool -> pinned replica
    inflight: dict[str, dict[str, int]]  # pool -> replica -> every live front's requests there
    # Placing a session with no live pin in a pool: live sessions per replica, and a ticket.
    sessions: dict[str, dict[str, int]] = field(default_factory=dict)  # pool -> replica -> sessions
    placement: dict[str, int] = field(default_factory=dict)  # pool -> this placement's ticket
    reserved: dict[str, str] = field(default_factory=dict)  # pool -> replica that counts it meanwhile
    # pool -> replica -> prefill blocks the fronts sent there that it has not computed yet
    work: dict[str, dict[str, float]] = field(default_factory=dict)
