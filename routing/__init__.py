"""Baton routing: the logic that picks a worker (and a site) for each request.

The rule: pure routing logic lives in routing/; deployments/ holds the Ray- and
Redis-facing shells that feed it. Nothing here imports Ray, torch, vLLM, redis
or any other third-party package, and no module opens a connection. Calls that
depend on time take ``now`` (seconds), so the same code runs in the Serve
deployment, in unit tests and in the trace simulator. The one exception is
``prefix.redis_state``: the index, pins and registry kept in Redis, driving a
client its caller injects (commands, pipelines, the Lua it registers; it reads
the wall clock for registry entries).

Subpackages, one concept each:

- ``prefix``: which engine holds which KV blocks. ``block_hash`` (chained,
  tenant-salted block hashes), ``hash_memo`` (hashes of recent prompts),
  ``index_api`` (the KVIndex contract), ``prefix_index`` (the in-process index
  and ``IndexSnapshot``), ``redis_state`` (index, pins and registry in Redis),
  ``snapshot`` (one request's view of that state), ``session_pins``,
  ``event_translator`` and ``event_sequence`` (engine KV events), ``lru_cache``
  (a bounded LRU of blocks, for the simulator and ``policy.approx_tree``)
- ``policy``: choosing an engine. ``contracts`` (request, load, decision, the
  Router ABC), ``policy``, ``cost``, ``rates``, ``spill`` (colocated or another
  engine), ``residency`` (which catalogue models have an engine),
  ``baton_router``, and the routers benches compare against: ``baselines``,
  ``approx_tree`` (Ray Serve's approximate prefix tree)
- ``sites``: choosing a site. ``site_select``, ``site_baselines``,
  ``site_policies`` (by name), ``site_backoff``, ``latency_map``, ``queueing``
  (Erlang C)
- ``sim``: only benches use it. ``trace`` (the Mooncake trace) and
  ``simulator`` (trace replay against simulated replicas)

This package re-exports the few names most callers need; they import only pure
modules, so ``import routing`` stays free of redis and vLLM.
"""

from routing.policy.baton_router import BatonRouter
from routing.prefix.block_hash import hash_blocks
from routing.policy.contracts import ReplicaLoad, Router, RoutingDecision, RoutingRequest
from routing.policy.policy import BatonPolicy, PolicyConfig
from routing.prefix.prefix_index import PrefixIndex
from routing.prefix.session_pins import SessionPins

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
