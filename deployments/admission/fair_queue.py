"""Weighted fair queue across the tenants of one priority tier.

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
ahead of this one", which the deadline check needs (``ahead_of_new``,
``ahead_of_head``).

Removing a request that was never served (cancelled, expired, displaced)
re-tags the tenant's later requests one step down, so a tenant is not
charged for service it never got.

This class only orders one tier: it has no bounds and no wait estimate.
``TieredQueue`` (tiered_queue.py) keeps one per priority tier and adds the
bounds, the push-out, the deadline check and Retry-After, built on the
``ahead`` counts and ``longest`` answered here.

Items must be hashable and distinct (``remove`` finds them by key). Pure and
not thread-safe; time comes in as ``now``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from .outcomes import Popped

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
    """Per-tenant FIFOs of one tier served in SCFQ order. See the module comment."""

    def __init__(self) -> None:
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

    def tenant_len(self, tenant: str) -> int:
        """Waiting requests of ``tenant``."""
        return len(self._queues.get(tenant, ()))

    def ahead_of_new(self, tenant: str, weight: float, without: T | None = None) -> int:
        """Queued requests served before one ``tenant`` would push now.

        ``without``: a queued item not to count (one about to be displaced).
        """
        finish = self._tail(tenant) + 1 / weight
        n = self._count_ahead(finish, math.inf)
        gone = self._entries.get(without) if without is not None else None
        if gone is not None and gone.finish <= finish:
            n -= 1
        return n

    def ahead_of_head(self, tenant: str) -> int:
        """Queued requests served before ``tenant``'s oldest one (0 if it has none)."""
        q = self._queues.get(tenant)
        return self._count_ahead(q[0].finish, q[0].seq) if q else 0

    def longest(self, exclude: str | None = None) -> tuple[T, float] | None:
        """Newest item of the tenant with the longest weight-normalised queue
        (``len/w``; the first such tenant on a tie) and that ``len/w``.
        ``exclude`` is left out; None when no tenant is left."""
        best: _Entry | None = None
        best_load = 0.0
        for t, q in self._queues.items():
            load = len(q) / q[-1].weight
            if t != exclude and load > best_load:
                best, best_load = q[-1], load
        return None if best is None else (best.item, best_load)  # type: ignore[return-value]

    # -- updates -------------------------------------------------------------
    def push(self, item: T, tenant: str, weight: float, deadline: float) -> None:
        """Queue ``item`` for ``tenant`` behind its earlier requests (``deadline``
        is absolute time). Changes the queue; no bound is checked here."""
        if item in self._entries:
            raise ValueError("item is already queued")
        if weight <= 0:
            raise ValueError(f"weight must be positive, got {weight}")
        start = self._tail(tenant)
        entry = _Entry(item, tenant, weight, deadline, self._seq, start, start + 1 / weight)
        self._seq += 1
        self._queues.setdefault(tenant, deque()).append(entry)
        self._entries[item] = entry

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
        """Remove a queued item (cancelled or displaced). False if it was not queued."""
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
