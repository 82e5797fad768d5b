"""Priority tiers of weighted fair queues: bounded, deadline-aware.

One ``FairQueue`` (SCFQ by tenant weight, fair_queue.py) per priority tier.
``tiers`` are listed highest first and served in strict priority: ``pop``
takes from the first non-empty tier, so a queued ``interactive`` request is
always admitted before any queued ``batch`` one, and batch proceeds only
while no interactive request waits. Within a tier tenants share by weight.
Strict priority can starve a lower tier under sustained higher-tier load; a
starved request expires at its deadline with a 429, which is why deferrable
tiers get long deadlines (``tier_deadlines_s``) rather than a share.

Thresholds:
* ``max_queue_per_tenant``: counted per tenant *per tier*. A tenant with this
  many waiting requests in a tier is rejected there (``tenant_queue_full``),
  so one tenant cannot fill the whole queue, and a tenant's deferred batch
  backlog never blocks its own interactive requests.
* ``max_queue_total``: counted across all tiers. When the whole queue is
  full, in this order:
  1. an arrival with a non-empty tier below its own displaces the newest
     request of the tenant with the longest weight-normalised queue
     (``len/w``) in the *lowest* non-empty tier: priority wins outright;
  2. otherwise, within the arrival's own tier, the newest request of the
     longest (``len/w``) other tenant is displaced, but only if the
     arrival's tenant would still be strictly shorter (``(len+1)/w``); this
     push-out sheds the tenant over its share, never the one under it;
  3. otherwise the arrival is rejected (``queue_full``).
  Displaced requests are returned so the caller answers them 429.
* Deadline: a request with ``deadline <= now`` is rejected at push and
  expired at pop/expire (``now >= deadline``). A push whose expected wait
  exceeds ``deadline - now`` is rejected at once (``deadline``).
* Expected wait = ``(ahead + 1) * S / servers``: ``ahead`` counts every
  request queued in higher tiers plus those ahead of it in its own tier's
  SCFQ order (a smaller-or-equal finish tag, so it already weighs tenants by
  their share); ``S`` is the EWMA of observed service times (``alpha`` =
  weight of the newest), ``servers`` the permit capacity, and the ``+1`` is
  the wait for the next permit to free. Before any service is observed the
  estimate is 0 and nothing is rejected early. The estimate ignores future
  arrivals that may overtake (any higher-tier arrival does); a request that
  falls behind expires in the queue with the same 429.
* ``retry_after_s`` is ``ceil`` of the wait that caused the rejection,
  clamped to ``[1, max_retry_after_s]``: for ``deadline`` the excess of the
  expected wait over the budget, for ``tenant_queue_full`` the wait until the
  tenant's head in that tier leaves the queue, for ``queue_full`` the wait
  for the next pop.

Items must be hashable and distinct across tiers. Pure and not thread-safe;
time comes in as ``now``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

from .fair_queue import FairQueue
from .outcomes import Admit, Popped, Reject, ShedReason

T = TypeVar("T", bound=Hashable)


class TieredQueue(Generic[T]):
    """Strict-priority tiers of SCFQ queues with shared bounds and wait estimate."""

    def __init__(self, tiers: Sequence[str], max_queue_per_tenant: int, max_queue_total: int,
                 servers: int = 1, ewma_alpha: float = 0.2, max_retry_after_s: int = 60) -> None:
        if not tiers or len(set(tiers)) != len(tiers):
            raise ValueError(f"tiers must be distinct and non-empty, got {list(tiers)}")
        self.tiers = tuple(tiers)
        self.max_queue_per_tenant = max_queue_per_tenant
        self.max_queue_total = max_queue_total
        self.servers = servers
        self.ewma_alpha = ewma_alpha
        self.max_retry_after_s = max_retry_after_s
        self.service_time_s: float | None = None  # EWMA; None until observed
        self._queues: dict[str, FairQueue[T]] = {t: FairQueue() for t in self.tiers}

    # -- queries (change nothing) --------------------------------------------
    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def __contains__(self, item: object) -> bool:
        return any(item in q for q in self._queues.values())

    def tier(self, name: str) -> FairQueue[T]:
        """The fair queue of tier ``name`` (read it; change it only through here)."""
        q = self._queues.get(name)
        if q is None:
            raise ValueError(f"unknown priority tier {name!r}; tiers are {list(self.tiers)}")
        return q

    def lengths(self) -> dict[str, int]:
        """Waiting requests per tenant, all tiers together (tenants with none are absent)."""
        out: dict[str, int] = {}
        for q in self._queues.values():
            for t, n in q.lengths().items():
                out[t] = out.get(t, 0) + n
        return out

    def tier_lengths(self) -> dict[str, int]:
        """Waiting requests per tier, every tier listed, highest first."""
        return {t: len(q) for t, q in self._queues.items()}

    def estimate_wait(self, tier: str, tenant: str, weight: float) -> float:
        """Expected wait of a request ``tenant`` would push to ``tier`` now."""
        return self._wait(self._above(tier) + self.tier(tier).ahead_of_new(tenant, weight))

    def retry_after(self, wait_s: float) -> int:
        """Retry-After hint for a wait: ceil, clamped to [1, max]. Changes nothing."""
        if not math.isfinite(wait_s):
            return self.max_retry_after_s
        return max(1, min(self.max_retry_after_s, math.ceil(wait_s)))

    # -- updates -------------------------------------------------------------
    def observe_service(self, seconds: float) -> None:
        """Fold one observed service time into the EWMA. Changes the estimate."""
        if seconds < 0:
            return
        s = self.service_time_s
        self.service_time_s = seconds if s is None else s + self.ewma_alpha * (seconds - s)

    def push(self, item: T, tier: str, tenant: str, weight: float, now: float,
             deadline: float, extra: int = 0) -> Admit[T] | Reject:
        """Queue ``item`` for ``tenant`` in ``tier`` (``deadline`` is absolute time).

        ``extra``: places it may take beyond both bounds (a session's turn at
        the site that holds its prefix, deployments/sites/site_link.py); where it
        finds the queue full even so, the push-out rule applies as to any.
        Changes the queue on Admit (and removes the displaced items, from this
        tier or a lower one); a Reject changes nothing.
        """
        q = self.tier(tier)
        if item in self:
            raise ValueError("item is already queued")
        if weight <= 0:
            raise ValueError(f"weight must be positive, got {weight}")
        if deadline <= now:
            return Reject(ShedReason.DEADLINE, 1)
        if q.tenant_len(tenant) >= self.max_queue_per_tenant + extra:
            head_ahead = self._above(tier) + q.ahead_of_head(tenant)
            head_wait = self._wait(head_ahead) if q.tenant_len(tenant) else 0.0
            return Reject(ShedReason.TENANT_QUEUE_FULL, self.retry_after(head_wait))
        victim = None  # (tier, item) to displace
        if len(self) >= self.max_queue_total + extra:
            victim = self._pushout_victim(tier, tenant, weight)
            if victim is None:
                return Reject(ShedReason.QUEUE_FULL, self.retry_after(self._wait(0)))
        own_victim = victim[1] if victim is not None and victim[0] == tier else None
        wait = self._wait(self._above(tier) + q.ahead_of_new(tenant, weight, without=own_victim))
        if wait > deadline - now:
            return Reject(ShedReason.DEADLINE, self.retry_after(wait - (deadline - now)))
        displaced: tuple[T, ...] = ()
        if victim is not None:
            self._queues[victim[0]].remove(victim[1])
            displaced = (victim[1],)
        q.push(item, tenant, weight, deadline)
        return Admit(wait, displaced)

    def pop(self, now: float) -> Popped[T]:
        """Take the next item: the highest non-empty tier, fair order within it.

        Drops and returns expired heads on the way (of every tier it looks
        at). Changes the queue and that tier's virtual time.
        """
        expired: list[T] = []
        for q in self._queues.values():
            if not len(q):
                continue
            popped = q.pop(now)
            expired.extend(popped.expired)
            if popped.item is not None:
                return Popped(popped.item, tuple(expired))
        return Popped(None, tuple(expired))

    def expire(self, now: float) -> list[T]:
        """Remove and return every item whose deadline passed: tier by tier,
        highest first, in push order within a tier. Changes the queue."""
        return [item for q in self._queues.values() for item in q.expire(now)]

    def remove(self, item: T) -> bool:
        """Remove a queued item (a cancelled request). False if it was not queued."""
        return any(q.remove(item) for q in self._queues.values())

    # -- internals -----------------------------------------------------------
    def _above(self, tier: str) -> int:
        """Requests queued in tiers of higher priority than ``tier``."""
        n = 0
        for t, q in self._queues.items():
            if t == tier:
                return n
            n += len(q)
        raise ValueError(f"unknown priority tier {tier!r}")

    def _wait(self, ahead: int) -> float:
        if self.service_time_s is None:
            return 0.0
        if self.servers <= 0:
            return math.inf
        return (ahead + 1) * self.service_time_s / self.servers

    def _pushout_victim(self, tier: str, tenant: str, weight: float) -> tuple[str, T] | None:
        below = self.tiers[self.tiers.index(tier) + 1:]
        for lower in reversed(below):
            found = self._queues[lower].longest()
            if found is not None:
                return lower, found[0]
        q = self._queues[tier]
        found = q.longest(exclude=tenant)
        if found is not None and found[1] > (q.tenant_len(tenant) + 1) / weight:
            return tier, found[0]
        return None
