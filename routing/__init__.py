"""Baton routing: pure logic that picks a worker for each request.

Nothing in this package imports Ray, torch, Redis or the network. Every call
that depends on time takes ``now`` (seconds) as a parameter, so the same code
runs in the Serve deployment, in unit tests and in the trace simulator.

Modules, one concept each:

- ``block_hash``    chained, tenant-salted hashes of full token blocks
- ``index_api``     the index contract (KVIndex); backends: ``prefix_index``, ``redis_state``
- ``prefix_index``  which replica holds which block hash (fed by KV events), in this process
- ``session_pins``  soft session -> replica pins with a TTL
- ``contracts``     dataclasses at the boundary (request, load, decision) and the Router ABC
- ``policy``        the Baton routing policy
- ``baton_router``  the policy plus its index and pins, fed by events
- ``baselines``     simple policies the benchmark compares against
- ``approx_tree``   approximate prefix tree used by one baseline
- ``lru_cache``     bounded LRU block cache of one simulated replica
- ``trace``         Mooncake trace loading
- ``simulator``     trace replay against a simulated pool
- ``bench_router``  command line benchmark
"""

from routing.baton_router import BatonRouter
from routing.block_hash import hash_blocks
from routing.contracts import ReplicaLoad, Router, RoutingDecision, RoutingRequest
from routing.policy import BatonPolicy, PolicyConfig
from routing.prefix_index import PrefixIndex
from routing.session_pins import SessionPins

__all__ = [
    "BatonPolicy",
    "BatonRouter",
    "PolicyConfig",
    "PrefixIndex",
    "ReplicaLoad",
    "Router",
    "RoutingDecision",
    "RoutingRequest",
    "SessionPins",
    "hash_blocks",
]
