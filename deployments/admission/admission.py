"""Admission control: permits in front of the engines, priority tiers of fair queues behind them.

``submit`` resolves the request's priority tier (the tenant's, or a lower
one it asked for), then admits it at once when a permit is free and nobody
is queued in any tier (a free permit with a non-empty queue cannot persist:
every call that frees a permit hands it to the queue). Otherwise the request
joins its tier's weighted fair queue (``TieredQueue``), or is shed with a
``ShedReason`` and ``retry_after_s``. ``release`` returns the permit the
moment generation ends and hands it to the next queued ticket: highest tier
first, fair order within it; the caller wakes the tickets in the returned
``Handoff``. Service time (admission to release) feeds the queue's
wait estimate, so deadlines are checked against what the engines really do.

A deadline is the time by which the request should see its first token, not
merely leave the queue: the start time (admission to first token, an EWMA
fed by ``observe_start``, plus four deviations) is taken off it before queueing, so a request is
queued only while it can still start in time, and refused at once otherwise.

Pure and not thread-safe: time comes in as ``now``; ``AsyncAdmission`` is the
asyncio shell.
"""

from __future__ import annotations

import itertools

from common.config import AdmissionConfig
from .outcomes import Admit, Popped, ShedReason
from .permits import Permits
from .stats import AdmissionSnapshot, TenantSnapshot, TenantStats
from .ticket import Handoff, Ticket, TicketState
from .tiered_queue import TieredQueue


class Admission:
    """Permits + priority-tiered fair queues + counters for one ingress."""

    def __init__(self, config: AdmissionConfig, replicas: int = 1) -> None:
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        self.config = config
        self.permits = Permits(config.capacity * replicas)
        self.queue: TieredQueue[Ticket] = TieredQueue(
            config.tiers, config.max_queue_per_tenant, config.max_queue_total,
            servers=self.permits.capacity, ewma_alpha=config.ewma_alpha,
            max_retry_after_s=config.max_retry_after_s,
        )
        self.stats: dict[str, TenantStats] = {}
        self.start_time_s: float | None = None  # EWMA of admission -> first token
        self.start_dev_s = 0.0  # EWMA of its absolute deviation
        self._ids = itertools.count(1)

    # -- requests ------------------------------------------------------------
    def submit(self, tenant: str, tier: str | None, now: float,
               deadline_s: float | None = None, extra_queue: int = 0) -> Ticket:
        """Admit, queue or shed a new request.

        ``tier`` is the requested priority tier: None means the tenant's own,
        a higher one than the tenant's is lowered to it, an unknown name
        raises ValueError (changing nothing). ``deadline_s`` None means the
        tier's default (``config.deadline_of``). ``extra_queue``: queue places
        it may take beyond the bounds (``TieredQueue.push``). Changes the permits
        (admitted), the queue (queued, and any displaced tickets, which come
        back SHED in ``ticket.displaced``) and the counters.
        """
        tier = self.config.tier_of(tenant, tier)
        weight = self.config.weight_of(tenant)
        if deadline_s is None:
            deadline_s = self.config.deadline_of(tier)
        ticket = Ticket(next(self._ids), tenant, tier, weight, now, now + deadline_s - self.start_margin_s)
        st = self._stats(tenant)
        st.submitted += 1
        if len(self.queue) == 0 and deadline_s > 0 and self.permits.try_acquire(ticket, tenant):
            self._admit(ticket, now)  # a free permit is its best chance, even a late one
            st.admitted_immediately += 1
            return ticket
        verdict = self.queue.push(ticket, tier, tenant, weight, now, ticket.deadline, extra_queue)
        if not isinstance(verdict, Admit):
            self._shed(ticket, verdict.reason, verdict.retry_after_s)
            return ticket
        st.queued += 1
        ticket.expected_wait_s = verdict.expected_wait_s
        for other in verdict.displaced:
            self._shed(other, ShedReason.DISPLACED, self._retry_hint(other))
            ticket.displaced.append(other)
        return ticket

    def release(self, ticket: Ticket, now: float) -> Handoff:
        """End ``ticket``: return its permit, or take it out of the queue.

        Safe to call more than once and on shed tickets (no-op). Changes the
        permits, the queue and the service-time estimate; returns the tickets
        the freed permit went to, and any that expired on the way.
        """
        if ticket.state is TicketState.QUEUED:
            self.queue.remove(ticket)
            ticket.state = TicketState.CANCELLED
            self._stats(ticket.tenant).cancelled += 1
            return Handoff()
        if ticket.state is not TicketState.ADMITTED:
            return Handoff()
        self.permits.release(ticket)
        ticket.state = TicketState.RELEASED
        ticket.released_at = now
        self._stats(ticket.tenant).completed += 1
        assert ticket.admitted_at is not None
        self.queue.observe_service(now - ticket.admitted_at)
        return self._fill(now)

    def observe_start(self, seconds: float) -> None:
        """Fold one admission-to-first-token time into the start estimate. Changes it."""
        if seconds < 0:
            return
        s, a = self.start_time_s, self.config.ewma_alpha
        if s is None:
            self.start_time_s, self.start_dev_s = seconds, seconds / 2
            return
        self.start_dev_s += a * (abs(seconds - s) - self.start_dev_s)
        self.start_time_s = s + a * (seconds - s)

    @property
    def start_margin_s(self) -> float:
        """What comes off a deadline before queueing: the start time plus four
        deviations (as TCP sizes its retransmission timeout), so a request
        admitted at the last moment still sees its first token in time."""
        return 0.0 if self.start_time_s is None else self.start_time_s + 4 * self.start_dev_s

    def expire(self, now: float) -> list[Ticket]:
        """Shed every queued ticket whose deadline passed. Changes the queue."""
        dead = self.queue.expire(now)
        for t in dead:
            self._shed(t, ShedReason.EXPIRED, self._retry_hint(t))
        return dead

    def set_capacity(self, permits: int, now: float, servers: int | None = None) -> Handoff:
        """Resize the permit pool to ``permits`` (a lease from a shared pool).

        Growing hands the new permits to queued tickets (returned); shrinking
        revokes nothing, it only stops new grants until in-use falls below
        the new size. ``servers`` (default ``permits``) is the
        number of permits the queue's wait estimate counts on: a front whose
        lease is about to grow passes its target.
        """
        self.permits.set_capacity(permits)
        self.queue.servers = self.permits.capacity if servers is None else servers
        return self._fill(now)

    # -- metrics -------------------------------------------------------------
    def snapshot(self) -> AdmissionSnapshot:
        """Counters and gauges per tenant and queue lengths per tier, copied. Changes nothing."""
        in_use = self.permits.in_use_by_tenant()
        lengths = self.queue.lengths()
        tenants = {
            t: TenantSnapshot(st.copy(), in_use.get(t, 0), lengths.get(t, 0))
            for t, st in self.stats.items()
        }
        return AdmissionSnapshot(self.permits.capacity, self.permits.in_use, len(self.queue),
                                 self.queue.service_time_s, tenants, self.queue.tier_lengths())

    # -- internals -----------------------------------------------------------
    def _stats(self, tenant: str) -> TenantStats:
        st = self.stats.get(tenant)
        if st is None:
            st = self.stats[tenant] = TenantStats()
        return st

    def _admit(self, ticket: Ticket, now: float) -> None:
        ticket.state = TicketState.ADMITTED
        ticket.admitted_at = now
        st = self._stats(ticket.tenant)
        st.admitted += 1
        st.observe_queue_time(now - ticket.submitted_at)

    def _shed(self, ticket: Ticket, reason: ShedReason, retry_after_s: int) -> None:
        ticket.state = TicketState.SHED
        ticket.reason = reason
        ticket.retry_after_s = retry_after_s
        self._stats(ticket.tenant).count_shed(reason)

    def _retry_hint(self, ticket: Ticket) -> int:
        return self.queue.retry_after(self.queue.estimate_wait(ticket.tier, ticket.tenant, ticket.weight))

    def _fill(self, now: float) -> Handoff:
        out = Handoff()
        while self.permits.free > 0 and len(self.queue):
            popped: Popped[Ticket] = self.queue.pop(now)
            for t in popped.expired:
                self._shed(t, ShedReason.EXPIRED, self._retry_hint(t))
                out.shed.append(t)
            if popped.item is None:
                break
            self.permits.try_acquire(popped.item, popped.item.tenant)
            self._admit(popped.item, now)
            out.admitted.append(popped.item)
        return out
