"""Which engine runs a request that a colocated front admitted.

Colocated fronts lease permits from one pool (deployments/admission/permit_leases.py),
so a front that receives more than its share of the traffic (clients keep
their connections, and the kernel spreads connections, not requests) may
hold more permits than its own engine should run. Such a front runs the
request on its own engine while that engine has fewer than ``capacity``
requests, and otherwise spills it to the peer engine with the most room:

    load(peer) = its running count at the last lease renewal
                 + what this front sent there since and has not seen finish

A peer at or over ``capacity`` is not chosen; if every engine is full the
request runs here (the permit already says the pool has room for it, so the
view is only stale). A front whose own engine died sends every request to the
peer with the most room, full or not, until Serve replaces its replica.
Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping


class SpillChooser:
    """One front's view of its peers' engine load, and the spill decision."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.peers: dict[str, int] = {}  # peer -> running at its last renewal
        self.sent: dict[str, int] = {}  # peer -> spilled there since that renewal, still running

    def update(self, running: Mapping[str, int]) -> None:
        """A fresh view of the peers' running counts (this front excluded).

        Changes the view; what this front sent a peer before is assumed to
        be in that peer's new count.
        """
        self.peers = dict(running)
        self.sent = {p: 0 for p in self.peers}

    def choose(self, own_running: int, own_alive: bool = True) -> str | None:
        """The peer to run the next request on, or None for this front's engine (where its engine
        died: None only without peers).

        Changes nothing; call ``started`` when the request is sent.
        """
        if own_alive and own_running < self.capacity:
            return None
        best, room = None, 0 if own_alive else float("-inf")
        for peer in sorted(self.peers):
            free = self.capacity - self.peers[peer] - self.sent.get(peer, 0)
            if free > room:
                best, room = peer, free
        return best

    def started(self, peer: str) -> None:
        """A request was spilled to ``peer``. Changes its load."""
        self.sent[peer] = self.sent.get(peer, 0) + 1

    def finished(self, peer: str) -> None:
        """A request spilled to ``peer`` ended. Changes its load (never below 0)."""
        if self.sent.get(peer, 0) > 0:
            self.sent[peer] -= 1
