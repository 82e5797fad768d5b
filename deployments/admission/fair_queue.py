"""Weighted fair queue across tenants, bounded and deadline-aware.

Algorithm: self-clocked fair queueing (SCFQ, Golestani 1994), a virtual
finish time scheme. Every request costs one unit (its service time is not
known at admission), so a request of a tenant with weight ``w`` advances that
tenant's virtual clock by ``1/w``:

    start  = finish tag of the tenant's last queued request, or V if none
    finish = start + 1/w
    V      = finish tag of the request popped most recently

``pop`` serves the smallest finish tag; ties go to the earlier push (``seq``),
so outcomes are exact and reproducible. A tenant that goes idle restarts at V
and earns no credit for its idle time; a backlogged tenant of weight 2 gets
two pops for every pop of a backlogged tenant of weight 1. A tenant sending
10x its share only lengthens its own run of tags: its requests sit behind
everyone else's, and a light tenant's next request is at most one pop per
other backlogged tenant away from the head. We chose SCFQ over deficit
round robin because the tags give a direct answer to "how many requests are
ahead of this one", which the deadline check below needs.

Removing a request that was never served (cancelled, expired, displaced)
re-tags the tenant's later requests one step down, so a tenant is not
charged for service it never got.

Thresholds:
* ``max_queue_per_tenant``: a tenant with this many waiting requests is
  rejected (``tenant_queue_full``); one tenant cannot fill the whole queue.
* ``max_queue_total``: when the whole queue is full, the arrival displaces
  the newest request of the tenant with the longest weight-normalised queue
  (``len/w``), but only if the arrival's tenant would still be strictly
  shorter (``(len+1)/w``) than that; otherwise the arrival is rejected
  (``queue_full``). This longest-queue push-out sheds the tenant that is over
  its share, never the one under it. Displaced requests are returned so the
  caller answers them 429.
* Deadline: a request with ``deadline <= now`` is rejected at push and
  expired at pop/expire (``now >= deadline``). A push whose expected wait
  exceeds ``deadline - now`` is rejected early (``deadline``).
* Expected wait = ``(ahead + 1) * S / servers``: ``ahead`` counts queued
  requests with a smaller-or-equal finish tag (the order they will be served
  in, so it already weighs tenants by their share), ``S`` is the EWMA of
  observed service times (``alpha`` = weight of the newest), ``servers`` the
  permit capacity, and the ``+1`` is the wait for the next permit to free.
  Before any service is observed the estimate is 0 and nothing is rejected
  early. The estimate ignores future arrivals that may overtake; a request
  that falls behind expires in the queue with the same 429.
* ``retry_after_s`` is ``ceil`` of the wait that caused the rejection,
  clamped to ``[1, max_retry_after_s]``: for ``deadline`` the excess of the
  expected wait over the budget, for ``tenant_queue_full`` the wait until the
  tenant's head leaves the queue, for ``queue_full`` the wait for the next pop.

Items must be hashable and distinct (``remove`` finds them by key). Pure and
not thread-safe; time comes in as ``now``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from .outcomes import Admit, Popped, Reject, ShedReason

T = TypeVar("T", bound=Hashable)


@dataclass(eq=False)
class _Entry:
    item: Hashable
    tenant: str
    weight: float
    deadline: float
    seq: int
    start: float
    finish: float


class FairQueue(Generic[T]):
    """Per-tenant bounded FIFOs served in SCFQ order. See the module comment."""

    def __init__(self, max_queue_per_tenant: int, max_queue_total: int, servers: int = 1,
                 ewma_alpha: float = 0.2, max_retry_after_s: int = 60) -> None:
        self.max_queue_per_tenant = max_queue_per_tenant
        self.max_queue_total = max_queue_total
        self.servers = servers
        self.ewma_alpha = ewma_alpha
        self.max_retry_after_s = max_retry_after_s
        self.service_time_s: float | None = None  # EWMA; None until observed
        self.virtual_time = 0.0
        self._queues: dict[str, deque[_Entry]] = {}  # only non-empty queues
        self._entries: dict[Hashable, _Entry] = {}
        self._seq = 0

    # -- queries (change nothing) --------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, item: object) -> bool:
        return item in self._entries

    def lengths(self) -> dict[str, int]:
        """Waiting requests per tenant (tenants with none are absent)."""
        return {t: len(q) for t, q in self._queues.items()}

    def estimate_wait(self, tenant: str, weight: float) -> float:
        """Expected wait of a request ``tenant`` would push now."""
        return self._wait(self._count_ahead(self._tail(tenant) + 1 / weight, math.inf))

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

    def push(self, item: T, tenant: str, weight: float, now: float,
             deadline: float) -> Admit[T] | Reject:
        """Queue ``item`` for ``tenant`` (``deadline`` is absolute time).

        Changes the queue on Admit (and removes the displaced items); a
        Reject changes nothing.
        """
        if item in self._entries:
            raise ValueError("item is already queued")
        if weight <= 0:
            raise ValueError(f"weight must be positive, got {weight}")
        if deadline <= now:
            return Reject(ShedReason.DEADLINE, 1)
        own = self._queues.get(tenant)
        if len(own or ()) >= self.max_queue_per_tenant:
            head_wait = self._wait(self._count_ahead(own[0].finish, own[0].seq)) if own else 0.0
            return Reject(ShedReason.TENANT_QUEUE_FULL, self.retry_after(head_wait))
        victim = None
        if len(self._entries) >= self.max_queue_total:
            victim = self._pushout_victim(tenant, weight)
            if victim is None:
                return Reject(ShedReason.QUEUE_FULL, self.retry_after(self._wait(0)))
        start = self._tail(tenant)
        finish = start + 1 / weight
        ahead = self._count_ahead(finish, math.inf)
        if victim is not None and victim.finish <= finish:
            ahead -= 1
        wait = self._wait(ahead)
        if wait > deadline - now:
            return Reject(ShedReason.DEADLINE, self.retry_after(wait - (deadline - now)))
        displaced: tuple[T, ...] = ()
        if victim is not None:
            self._remove_entry(victim)
            displaced = (victim.item,)  # type: ignore[assignment]
        entry = _Entry(item, tenant, weight, deadline, self._seq, start, finish)
        self._seq += 1
        self._queues.setdefault(tenant, deque()).append(entry)
        self._entries[item] = entry
        return Admit(wait, displaced)

    def pop(self, now: float) -> Popped[T]:
        """Take the next item in fair order; drop and return expired heads on the way.

        Changes the queue and advances the virtual time to the served finish tag.
        """
        expired: list[T] = []
        while self._queues:
            best = min((q[0] for q in self._queues.values()), key=lambda e: (e.finish, e.seq))
            if best.deadline <= now:
                self._remove_entry(best)
                expired.append(best.item)  # type: ignore[arg-type]
                continue
            self._remove_entry(best, served=True)
            self.virtual_time = best.finish
            return Popped(best.item, tuple(expired))  # type: ignore[arg-type]
        return Popped(None, tuple(expired))

    def expire(self, now: float) -> list[T]:
        """Remove and return every item whose deadline passed, in push order."""
        dead = sorted((e for e in self._entries.values() if e.deadline <= now), key=lambda e: e.seq)
        for e in dead:
            self._remove_entry(e)
        return [e.item for e in dead]  # type: ignore[misc]

    def remove(self, item: T) -> bool:
        """Remove a queued item (a cancelled request). False if it was not queued."""
        entry = self._entries.get(item)
        if entry is None:
            return False
        self._remove_entry(entry)
        return True

    # -- internals -----------------------------------------------------------
    def _tail(self, tenant: str) -> float:
        q = self._queues.get(tenant)
        return q[-1].finish if q else self.virtual_time

    def _count_ahead(self, finish: float, seq: float) -> int:
        n = 0
        for q in self._queues.values():
            for e in q:  # tags rise along each queue
                if (e.finish, e.seq) >= (finish, seq):
                    break
                n += 1
        return n

    def _wait(self, ahead: int) -> float:
        if self.service_time_s is None:
            return 0.0
        if self.servers <= 0:
            return math.inf
        return (ahead + 1) * self.service_time_s / self.servers

    def _pushout_victim(self, tenant: str, weight: float) -> _Entry | None:
        own = (len(self._queues.get(tenant, ())) + 1) / weight
        best, best_load = None, own
        for t, q in self._queues.items():
            load = len(q) / q[-1].weight
            if t != tenant and load > best_load:
                best, best_load = q[-1], load
        return best

    def _remove_entry(self, entry: _Entry, served: bool = False) -> None:
        del self._entries[entry.item]
        q = self._queues[entry.tenant]
        i = q.index(entry)
        del q[i]
        if not served:  # unserved: re-tag the later entries one step down
            prev = entry.start
            for later in list(q)[i:]:
                later.start, later.finish = prev, prev + 1 / later.weight
                prev = later.finish
        if not q:
            del self._queues[entry.tenant]
