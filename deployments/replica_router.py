"""Serve request router that sends a request to the replica Baton chose.

Baton's routing decision (routing/policy.py) names a replica id; the engine
request carries it as `target_replica`. This router ranks that replica first
and every other replica second, so a request still goes somewhere when the
chosen replica is gone or full; a request with no target falls back to
Serve's power of two choices.
"""

from __future__ import annotations

from typing import List, Optional

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import PendingRequest, RunningReplica

PATH = "deployments.replica_router:TargetedRequestRouter"


def target_of(pending: Optional[PendingRequest]) -> str | None:
    if pending is None or not pending.args:
        return None
    return getattr(pending.args[0], "target_replica", None)


class TargetedRequestRouter(PowerOfTwoChoicesRequestRouter):
    async def choose_replicas(
        self,
        candidate_replicas: List[RunningReplica],
        pending_request: Optional[PendingRequest] = None,
    ) -> List[List[RunningReplica]]:
        target = target_of(pending_request)
        if target is not None:
            first = [r for r in candidate_replicas if r.replica_id.unique_id == target]
            if first:
                rest = [r for r in candidate_replicas if r.replica_id.unique_id != target]
                return [first, rest] if rest else [first]
        return await super().choose_replicas(candidate_replicas, pending_request)
