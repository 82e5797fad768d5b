"""Counting pool of concurrency permits for the engine replicas.

A request holds one permit while it occupies an engine. The permit goes back
the moment generation ends, not when a slow reader finishes the stream, so a
slow client cannot hold engine capacity hostage. ``release`` is idempotent:
the ingress may call it from both the end-of-generation hook and a ``finally``
block, and the pool never goes negative.

Capacity changes at runtime (replicas added or removed). Shrinking below
``in_use`` revokes nothing: the holders finish, and no new permit is granted
until ``in_use`` falls under the new capacity. Pure and not thread-safe.
"""

from __future__ import annotations

from collections.abc import Hashable


class Permits:
    """Permits keyed by holder; a holder holds at most one."""

    def __init__(self, capacity: int) -> None:
        self._capacity = 0
        self.set_capacity(capacity)
        self._holders: dict[Hashable, str] = {}  # holder -> tenant
        self._by_tenant: dict[str, int] = {}
        self.acquired_total = 0
        self.released_total = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def in_use(self) -> int:
        return len(self._holders)

    @property
    def free(self) -> int:
        """Permits that ``try_acquire`` could grant now (never negative)."""
        return max(0, self._capacity - len(self._holders))

    def set_capacity(self, capacity: int) -> None:
        """Change the pool size. Changes capacity only; holders keep their permits."""
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._capacity = capacity

    def holds(self, holder: Hashable) -> bool:
        """Whether ``holder`` holds a permit. Changes nothing."""
        return holder in self._holders

    def try_acquire(self, holder: Hashable, tenant: str = "") -> bool:
        """Grant ``holder`` a permit if one is free.

        Changes the pool on success. A holder that already holds a permit gets
        True and no second permit.
        """
        if holder in self._holders:
            return True
        if self.free == 0:
            return False
        self._holders[holder] = tenant
        self._by_tenant[tenant] = self._by_tenant.get(tenant, 0) + 1
        self.acquired_total += 1
        return True

    def release(self, holder: Hashable) -> bool:
        """Return ``holder``'s permit. True if it held one; a second call is a no-op."""
        if holder not in self._holders:
            return False
        tenant = self._holders.pop(holder)
        n = self._by_tenant[tenant] - 1
        if n:
            self._by_tenant[tenant] = n
        else:
            del self._by_tenant[tenant]
        self.released_total += 1
        return True

    def in_use_by_tenant(self) -> dict[str, int]:
        """Permits held per tenant (tenants holding none are absent). A copy."""
        return dict(self._by_tenant)
