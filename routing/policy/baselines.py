"""Baseline routers the benchmark compares Baton against.

All take load from ``ReplicaLoad`` and break ties deterministically or with
the seeded RNG they are given, so replays are reproducible.
"""

from __future__ import annotations

import random

from routing.policy.approx_tree import ApproxPrefixTree
from routing.policy.contracts import ReplicaLoad, Router, RoutingDecision, RoutingRequest, scalar_loads
from routing.prefix.prefix_index import PrefixIndex


def live_loads(loads: dict[str, ReplicaLoad]) -> dict[str, float]:
    """Scalar load of each live replica; raises when none is alive."""
    load = scalar_loads(loads)
    if not load:
        raise ValueError("no live replica to route to")
    return load


def pow2(names: list[str], load: dict[str, float], rng: random.Random) -> str:
    """Power of two choices: the less loaded of two random candidates."""
    if len(names) == 1:
        return names[0]
    a, b = rng.sample(names, 2)
    return a if load[a] <= load[b] else b


class RoundRobin(Router):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def route(self, request: RoutingRequest, loads: dict[str, ReplicaLoad], now: float) -> RoutingDecision:
        names = list(live_loads(loads))
        choice = names[self._next % len(names)]
        self._next += 1
        return RoutingDecision(choice, "load")


class LeastLoaded(Router):
    name = "least_loaded"

    def route(self, request: RoutingRequest, loads: dict[str, ReplicaLoad], now: float) -> RoutingDecision:
        load = live_loads(loads)
        choice = min(load, key=lambda n: (load[n], loads[n].running + loads[n].queued))
        return RoutingDecision(choice, "load")


class GreedyCapped(Router):
    """Longest exact prefix among replicas whose load is under a cap.

    Cap: ``load <= cap_ratio * mean load + slack_blocks``. Ties and misses go
    to the least loaded. Fed by KV events like Baton.
    """

    name = "greedy_capped"

    def __init__(self, cap_ratio: float = 1.15, slack_blocks: float = 100.0) -> None:
        self.cap_ratio = cap_ratio
        self.slack_blocks = slack_blocks
        self.index = PrefixIndex()

    def route(self, request: RoutingRequest, loads: dict[str, ReplicaLoad], now: float) -> RoutingDecision:
        load = live_loads(loads)
        cap = self.cap_ratio * sum(load.values()) / len(load) + self.slack_blocks
        under = [n for n in load if load[n] <= cap] or list(load)
        match = self.index.match(request.block_hashes)
        choice = min(under, key=lambda n: (-match.get(n, 0), load[n]))
        cached = match.get(choice, 0)
        return RoutingDecision(choice, "prefix" if cached else "load", cached)

    def on_kv_stored(self, replica: str, block_hashes: list[int], parent: int | None) -> None:
        self.index.apply_stored(replica, block_hashes, parent)

    def on_kv_removed(self, replica: str, block_hashes: list[int]) -> None:
        self.index.apply_removed(replica, block_hashes)


class TextPrefixTree(Router):
    """Ray Serve ``PrefixCacheAffinityRouter`` style, on an approximate tree.

    1. If max - min queue length (running + queued) > ``imbalanced_threshold``:
       power of two choices.
    2. Else match the request in the routing-history tree: if the best match
       ratio >= ``match_rate_threshold``, pick among the best-matching
       replicas (pow2 between them); otherwise pick among the replicas with
       the smallest tree share (to fill idle caches).
    3. Insert the request under the chosen replica.
    """

    name = "text_prefix_tree"

    def __init__(
        self,
        tenant_capacity: int,
        rng: random.Random,
        imbalanced_threshold: int = 10,
        match_rate_threshold: float = 0.1,
    ) -> None:
        self.tree = ApproxPrefixTree(tenant_capacity)
        self.rng = rng
        self.imbalanced_threshold = imbalanced_threshold
        self.match_rate_threshold = match_rate_threshold

    def route(self, request: RoutingRequest, loads: dict[str, ReplicaLoad], now: float) -> RoutingDecision:
        names = [n for n, l in loads.items() if l.alive]
        if not names:
            raise ValueError("no live replica to route to")
        # Ray compares queue lengths (requests in flight), in pow2 as well.
        queue = {n: float(loads[n].running + loads[n].queued) for n in names}
        if max(queue.values()) - min(queue.values()) > self.imbalanced_threshold:
            return RoutingDecision(pow2(names, queue, self.rng), "load")
        match = self.tree.match(request.block_hashes)
        best = max((match.get(n, 0) for n in names), default=0)
        n_blocks = max(1, request.n_blocks)
        if best / n_blocks >= self.match_rate_threshold:
            top = [n for n in names if match.get(n, 0) == best]
            return RoutingDecision(pow2(top, queue, self.rng), "prefix", best)
        smallest = min(self.tree.size(n) for n in names)
        low = [n for n in names if self.tree.size(n) == smallest]
        return RoutingDecision(pow2(low, queue, self.rng), "load")

    def on_routed(self, request: RoutingRequest, replica: str, now: float) -> None:
        self.tree.insert(request.block_hashes, replica)

    def on_replica_removed(self, replica: str) -> None:
        self.tree.remove_tenant(replica)
