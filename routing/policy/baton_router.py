"""Baton's router: the policy plus the state it reads (index, pins).

This is the object a Serve deployment or the simulator holds. It receives
engine KV events and replica lifecycle events and keeps the index and pins
in step; the decision logic lives in ``policy.BatonPolicy``.
"""

from __future__ import annotations

import random

from routing.policy.contracts import ReplicaLoad, Router, RoutingDecision, RoutingRequest
from routing.policy.policy import BatonPolicy, PolicyConfig
from routing.prefix.prefix_index import PrefixIndex
from routing.prefix.session_pins import SessionPins


class BatonRouter(Router):
    name = "baton"

    def __init__(
        self,
        config: PolicyConfig | None = None,
        rng: random.Random | None = None,
        pin_ttl_s: float = 600.0,
    ) -> None:
        self.policy = BatonPolicy(config, rng)
        self.index = PrefixIndex()
        self.pins = SessionPins(pin_ttl_s)
        self._next_expiry = 0.0

    def route(self, request: RoutingRequest, loads: dict[str, ReplicaLoad], now: float,
              placement: int | None = None) -> RoutingDecision:
        """Route via the policy (``placement``: a new session's ticket, as ``BatonPolicy.route``
        takes it). Changes the pins (see ``BatonPolicy.route``); expired pins are swept every
        tenth of the TTL."""
        if now >= self._next_expiry:
            self.pins.expire(now)
            self._next_expiry = now + self.pins.ttl_s / 10
        return self.policy.route(request, loads, self.index, self.pins, now, placement)

    def on_kv_stored(self, replica: str, block_hashes: list[int], parent: int | None) -> None:
        self.index.apply_stored(replica, block_hashes, parent)

    def on_kv_removed(self, replica: str, block_hashes: list[int]) -> None:
        self.index.apply_removed(replica, block_hashes)

    def on_replica_removed(self, replica: str) -> None:
        self.index.remove_replica(replica)
        self.pins.forget_replica(replica)
