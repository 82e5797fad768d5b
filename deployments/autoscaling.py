"""Serve autoscaling on the requests the replicas really have in flight.

Requests reach engine replicas over their own HTTP servers, never through a
Serve handle, so Serve's built-in count of ongoing requests stays at zero.
Each replica therefore reports its in-flight HTTP requests as the custom
metric `ongoing` (`EngineReplica.record_autoscaling_stats`), and this policy
does what Serve's default does with its own count: as many replicas as the
pool's in-flight requests divided by `target_ongoing_requests`. Serve wraps
it with the pool's min/max bounds and up/downscale delays.
"""

from __future__ import annotations

METRIC = "ongoing"
POLICY = "deployments.autoscaling:in_flight_policy"


def in_flight_policy(ctx) -> tuple[float, dict]:
    """Desired replicas from the `ongoing` metric; changes nothing."""
    if ctx.current_num_replicas == 0:
        return ctx.target_num_replicas, {}
    per_replica = (ctx.aggregated_metrics or {}).get(METRIC, {})
    total = sum(per_replica.values())
    return total / ctx.config.get_target_ongoing_requests(), {}
