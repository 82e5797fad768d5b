"""Per-tenant admission counters, for the ingress to export to Prometheus.

Counters only grow; gauges (permits in use, queue length per tenant and per
tier) are read from the pools when a snapshot is taken. Queue time is kept as sum/count/max so the
exporter can publish a mean without holding every observation; the ticket's
own ``queue_time_s`` is there for a histogram.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .outcomes import ShedReason


@dataclass
class TenantStats:
    submitted: int = 0
    admitted: int = 0  # got a permit, at once or after queueing
    admitted_immediately: int = 0
    queued: int = 0  # entered the queue
    completed: int = 0  # released a permit
    cancelled: int = 0  # left the queue before admission
    shed: dict[ShedReason, int] = field(default_factory=dict)
    queue_time_sum_s: float = 0.0
    queue_time_count: int = 0
    queue_time_max_s: float = 0.0

    @property
    def shed_total(self) -> int:
        return sum(self.shed.values())

    def count_shed(self, reason: ShedReason) -> None:
        self.shed[reason] = self.shed.get(reason, 0) + 1

    def observe_queue_time(self, seconds: float) -> None:
        self.queue_time_sum_s += seconds
        self.queue_time_count += 1
        self.queue_time_max_s = max(self.queue_time_max_s, seconds)

    def copy(self) -> TenantStats:
        return replace(self, shed=dict(self.shed))


@dataclass(frozen=True)
class TenantSnapshot:
    stats: TenantStats  # a copy
    in_use: int  # permits held now
    queue_len: int  # requests waiting now, all tiers


@dataclass(frozen=True)
class AdmissionSnapshot:
    capacity: int
    permits_in_use: int
    queue_len: int
    service_time_s: float | None  # EWMA of observed service times
    tenants: dict[str, TenantSnapshot]
    tier_queue_len: dict[str, int] = field(default_factory=dict)  # every tier, highest first
