"""Admission configuration: one dataclass, validated in ``__post_init__``.

Capacity is per replica so the pool can grow with the deployment; tenants map
to tiers and tiers to weighted-fair-queueing weights. A tenant not named in
``tenant_tiers`` gets ``default_tier``; a tier not named in ``tier_weights``
(for example a mistyped header) also falls back to ``default_tier`` rather than
failing the request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class AdmissionConfig:
    """Everything the admission controller needs; pure data."""

    capacity_per_replica: int  # permits (concurrent requests in the engine) per replica
    max_queue_per_tenant: int  # waiting requests one tenant may hold
    max_queue_total: int  # waiting requests across all tenants
    default_deadline_s: float  # queueing deadline when the request sets none
    tier_weights: dict[str, float] = field(default_factory=lambda: {"default": 1.0})
    tenant_tiers: dict[str, str] = field(default_factory=dict)
    default_tier: str = "default"
    ewma_alpha: float = 0.2  # weight of the newest service time in the EWMA
    max_retry_after_s: int = 60  # ceiling on the Retry-After hint

    def __post_init__(self) -> None:
        if self.capacity_per_replica < 1:
            raise ValueError(f"capacity_per_replica must be >= 1, got {self.capacity_per_replica}")
        if self.max_queue_per_tenant < 0:
            raise ValueError(f"max_queue_per_tenant must be >= 0, got {self.max_queue_per_tenant}")
        if self.max_queue_total < self.max_queue_per_tenant:
            raise ValueError(
                f"max_queue_total ({self.max_queue_total}) must be >= "
                f"max_queue_per_tenant ({self.max_queue_per_tenant})"
            )
        if not (self.default_deadline_s > 0 and math.isfinite(self.default_deadline_s)):
            raise ValueError(f"default_deadline_s must be positive, got {self.default_deadline_s}")
        if not self.tier_weights:
            raise ValueError("tier_weights must name at least one tier")
        for tier, w in self.tier_weights.items():
            if not (w > 0 and math.isfinite(w)):
                raise ValueError(f"weight of tier {tier!r} must be positive, got {w}")
        if self.default_tier not in self.tier_weights:
            raise ValueError(f"default_tier {self.default_tier!r} is not in tier_weights")
        for tenant, tier in self.tenant_tiers.items():
            if tier not in self.tier_weights:
                raise ValueError(f"tenant {tenant!r} has unknown tier {tier!r}")
        if not 0 < self.ewma_alpha <= 1:
            raise ValueError(f"ewma_alpha must be in (0, 1], got {self.ewma_alpha}")
        if self.max_retry_after_s < 1:
            raise ValueError(f"max_retry_after_s must be >= 1, got {self.max_retry_after_s}")

    def tier_of(self, tenant: str, tier: str | None = None) -> str:
        """The tier that applies: ``tier`` if known, else the tenant's, else the default."""
        if tier is not None and tier in self.tier_weights:
            return tier
        return self.tenant_tiers.get(tenant, self.default_tier)

    def weight_of(self, tier: str) -> float:
        """WFQ weight of ``tier`` (the default tier's weight if unknown)."""
        return self.tier_weights.get(tier, self.tier_weights[self.default_tier])
