"""Admission control for the Baton ingress: permits, priority tiers, weighted fair queueing, shedding.

Pure logic (time passed in as ``now``), with ``AsyncAdmission`` as the asyncio
shell. Every shed request is a 429 with ``Retry-After``, never a 5xx.

* ``AdmissionConfig`` (tiers, tenant weights, bounds, deadlines) lives in common.config
* ``permits``         Permits: the per-replica concurrency pool
* ``fair_queue``      FairQueue: SCFQ across the tenants of one tier
* ``tiered_queue``    TieredQueue: strict-priority tiers of fair queues, bounded, deadline-aware
* ``admission``       Admission: permits + queue + counters; Ticket lifecycle
* ``async_admission`` AsyncAdmission, Permit, Shed
* ``simulate``        simulate_overload: deterministic overload runs
* ``permit_leases``   engine permits shared by every front through Redis leases (not re-exported)
* ``lag_limit``       LagLimit: fewer permits than the lease while the front's event loop lags (not re-exported)
"""

from .admission import Admission
from .async_admission import AsyncAdmission, Permit, Shed
from common.config import AdmissionConfig
from .fair_queue import FairQueue
from .outcomes import Admit, Popped, Reject, ShedReason
from .permits import Permits
from .simulate import (
    OverloadResult, TenantOutcome, max_min_fair_share, priority_fair_share, simulate_overload, two_tenant_load,
)
from .stats import AdmissionSnapshot, TenantSnapshot, TenantStats
from .ticket import Handoff, Ticket, TicketState
from .tiered_queue import TieredQueue

__all__ = [
    "Admission", "AdmissionConfig", "AdmissionSnapshot", "Admit", "AsyncAdmission",
    "FairQueue", "Handoff", "OverloadResult", "Permit", "Permits", "Popped", "Reject",
    "Shed", "ShedReason", "TenantOutcome", "TenantSnapshot", "TenantStats", "Ticket",
    "TicketState", "TieredQueue", "max_min_fair_share", "priority_fair_share", "simulate_overload",
    "two_tenant_load",
]
