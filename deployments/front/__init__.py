"""The HTTP apps of an engine replica and their per-request work: the public front (front) and its
request pipeline (pipeline/: auth, admission, parse, model, route, prefill, dispatch, finish), the
internal app for other replicas (internal), routing on shared state (request_routing, shared_view),
moving answers (relay, first_token), readiness, and Prometheus metrics (metrics, metrics_scrape).
"""
