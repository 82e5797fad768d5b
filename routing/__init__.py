"""Baton routing: pure logic that picks a worker for each request.

Nothing in this package imports Ray, torch, Redis or the network. Every call
that depends on time takes ``now`` (seconds) as a parameter, so the same code
runs in the Serve deployment, in unit tests and in the trace simulator.

Modules, one concept each:

- requests and the index: ``block_hash`` (chained, tenant-salted block hashes),
  ``hash_memo`` (hashes of recent prompts), ``contracts`` (request, load, decision,
  the Router ABC), ``index_api`` (the KVIndex contract), ``prefix_index`` (the
  in-process index and ``IndexSnapshot``), ``redis_state`` (the index, pins and
  registry in Redis), ``snapshot`` (one request's view of that state),
  ``session_pins``, ``event_translator`` and ``event_sequence`` (engine KV events)
- the policy: ``policy``, ``cost``, ``rates``, ``spill`` (colocated or another
  engine), ``residency`` (which catalogue models have an engine), ``baton_router``
- across sites: ``site_select``, ``site_baselines``, ``site_policies`` (by name),
  ``site_backoff``, ``latency_map``, ``queueing`` (Erlang C)
- for benchmarks: ``baselines``, ``approx_tree``, ``lru_cache``, ``trace``, ``simulator``
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
