"""Baton's Ray Serve deployments: the Ray- and Redis-facing shells around routing/'s pure logic.

At the top level, the process shell of an engine replica: ``app`` (builds the Serve application
graph from the config), ``replica`` (the Serve deployment hosting vLLM and its HTTP servers) and
``serving`` (an ASGI app served in this process, and the engine's processes). The rest, by concept:

- ``api``: the OpenAI (and Anthropic Messages) surface: request schemas and errors, the APIs,
  bodies, request headers, API keys, the Responses API and its store
- ``front``: the public and internal HTTP apps of a replica and what they do per request:
  routing on shared state (request_routing, shared_view), relaying and first tokens, readiness,
  Prometheus metrics and their pool-wide scrape
- ``admission``: permits, tiered fair queues, shedding, and the permits leased through Redis
- ``kv_index``: the KV indexer (engine KV events into the shared index), event replay, the index feed
- ``catalogue``: a catalogue's engines on one replica, their actors, runtime_envs and model routing
- ``batch``: the Files and Batch API, its store and its runner
- ``sites``: one front's link to the other sites
- ``autoscaling``: Serve autoscaling policies, forecast-based replica counts, forecasters and
  measured capacity curves (with capacity_tiny_cpu.yaml)
"""
