"""The `admission` section of Baton's config (common/config.py)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from common.config.base import _PositiveFinite, _Strict

# Permits per CPU engine when `capacity_per_replica` is unset: a CPU engine runs few sequences at a
# useful pace, where its max_num_seqs (vLLM's default 128) would only queue them inside it.
CPU_CAPACITY = 16


class AdmissionConfig(_Strict):
    """Admission control: engine permits, priority tiers, weighted fair queues, shedding.

    Capacity is per decode replica so the pool can grow. ``tiers`` are served in
    strict priority order; within a tier tenants share by ``tenant_weights``. A
    tenant's tier (``tenant_tiers``, else ``default_tier``) is its default and the
    highest it may use: a request may ask for a lower tier (deferrable work).
    """

    capacity_per_replica: int | None = Field(
        None, ge=1, description="engine permits per decode replica: requests generating at once; unset, the "
        "engine's max_num_seqs on a GPU or the timed executor (vLLM's default: 1024 on an H100), "
        f"{CPU_CAPACITY} on a CPU engine",
    )
    max_queue_per_tenant: int = Field(64, ge=0, description="waiting requests one tenant may hold in each tier")
    max_queue_total: int = Field(256, ge=0, description="waiting requests across all tenants and tiers")
    default_deadline_s: float = Field(
        30, gt=0, allow_inf_nan=False,
        description="seconds by which a request should see its first token, unless tier_deadlines_s or "
        "the x-baton-deadline-s header sets one; a request that cannot make it is refused at once",
    )
    tiers: list[str] = Field(
        default_factory=lambda: ["interactive", "batch"],
        description="priority tiers, highest first: all queued requests of a tier go before any of the next",
    )
    default_tier: str = Field("interactive", description="tier of tenants not in tenant_tiers")
    tenant_tiers: dict[str, str] = Field(
        default_factory=dict, description="tenant -> its default tier, the highest its requests may use"
    )
    tenant_weights: dict[str, _PositiveFinite] = Field(
        default_factory=dict, description="tenant -> fair-queueing weight within a tier"
    )
    default_weight: _PositiveFinite = Field(1.0, description="weight of tenants not in tenant_weights")
    tier_deadlines_s: dict[str, _PositiveFinite] = Field(
        default_factory=dict, description="tier -> its first-token deadline (e.g. batch: 600, for "
        "deferrable work); other tiers use default_deadline_s",
    )
    max_loop_lag_s: float | None = Field(
        0.015, gt=0, allow_inf_nan=False,
        description="mean lag of a front's event loop over half a second above which it grants fewer permits "
        f"than its lease, down to max({CPU_CAPACITY}, capacity_per_replica / 8), until the lag falls "
        "(deployments/admission/lag_limit.py); null: never",
    )
    ewma_alpha: float = Field(0.2, gt=0, le=1, description="weight of the newest service time in the EWMA")
    max_retry_after_s: int = Field(60, ge=1, description="ceiling on the Retry-After hint")

    @property
    def capacity(self) -> int:
        """Permits per decode replica: `capacity_per_replica`, else CPU_CAPACITY until `resolved`."""
        return self.capacity_per_replica or CPU_CAPACITY

    def resolved(self, engine_max_num_seqs: int | None) -> "AdmissionConfig":
        """A copy with `capacity_per_replica` set: as configured, else the engine's `max_num_seqs`
        (pass None for an engine whose limit is not worth following: a CPU engine's), else
        CPU_CAPACITY. Changes nothing. Sized for CPU engines, 16 permits refused a GPU engine's
        load at 100 req/s while it idled (docs/bench_scale.md)."""
        if self.capacity_per_replica is not None:
            return self
        return self.model_copy(update={"capacity_per_replica": engine_max_num_seqs or CPU_CAPACITY})

    @field_validator("tiers")
    @classmethod
    def _tiers_distinct(cls, v: list[str]) -> list[str]:
        if not v or len(set(v)) != len(v) or not all(v):
            raise ValueError(f"tiers must be one or more distinct non-empty names, got {v}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "AdmissionConfig":
        if self.max_queue_total < self.max_queue_per_tenant:
            raise ValueError(f"max_queue_total ({self.max_queue_total}) must be >= "
                             f"max_queue_per_tenant ({self.max_queue_per_tenant})")
        if self.default_tier not in self.tiers:
            raise ValueError(f"default_tier {self.default_tier!r} is not one of tiers {self.tiers}")
        for tenant, tier in self.tenant_tiers.items():
            if tier not in self.tiers:
                raise ValueError(f"tenant_tiers: tenant {tenant!r} has tier {tier!r}, "
                                 f"not one of tiers {self.tiers}")
        for tier in self.tier_deadlines_s:
            if tier not in self.tiers:
                raise ValueError(f"tier_deadlines_s: {tier!r} is not one of tiers {self.tiers}")
        return self

    def tier_of(self, tenant: str, requested: str | None = None) -> str:
        """The tier a request of ``tenant`` is queued in.

        ``requested`` None gives the tenant's tier; a requested tier lower
        than the tenant's is granted, a higher one gives the tenant's own.
        Raises ValueError for a tier name not in ``tiers``.
        """
        own = self.tenant_tiers.get(tenant, self.default_tier)
        if requested is None:
            return own
        return requested if self._rank(requested) > self._rank(own) else own

    def weight_of(self, tenant: str) -> float:
        """Fair-queueing weight of ``tenant`` within a tier."""
        return self.tenant_weights.get(tenant, self.default_weight)

    def deadline_of(self, tier: str) -> float:
        """Default first-token deadline (seconds) of ``tier``; ValueError if unknown."""
        self._rank(tier)
        return self.tier_deadlines_s.get(tier, self.default_deadline_s)

    def _rank(self, tier: str) -> int:
        if tier not in self.tiers:
            raise ValueError(f"unknown priority tier {tier!r}; tiers are {self.tiers}")
        return self.tiers.index(tier)
