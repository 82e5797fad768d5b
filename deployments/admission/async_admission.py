"""asyncio shell around ``Admission``: wait for a permit, or raise ``Shed``.

    permit = await gate.acquire(tenant, priority, deadline_s)   # may raise Shed
    try:
        async for chunk in engine.generate(...):
            ...
            if finished: permit.release()   # generation ended: free the engine
        ...stream the rest to a slow reader...
    finally:
        permit.release()                     # no-op if already released

or ``async with gate.slot(tenant, priority, deadline_s) as permit:``.

Each queued request waits on an ``asyncio.Future`` and has a timer at its
deadline; a release, a capacity change or the timer resolves the future.
Cancelling a waiting ``acquire`` takes the ticket out of the queue (or, if a
permit was granted in the meantime, gives it straight back). This is the only
module that reads the clock (``time.monotonic``). Call everything from the
event loop's thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from .admission import Admission
from .stats import AdmissionSnapshot
from .ticket import Handoff, Ticket, TicketState


class Shed(Exception):
    """The request was shed: answer ``429`` with ``Retry-After: retry_after_s``."""

    status_code = 429

    def __init__(self, retry_after_s: int, reason: str) -> None:
        super().__init__(f"shed ({reason}); retry after {retry_after_s}s")
        self.retry_after_s = retry_after_s
        self.reason = reason

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class Permit:
    """A granted permit. ``release`` is idempotent and synchronous."""

    def __init__(self, gate: AsyncAdmission, ticket: Ticket) -> None:
        self._gate = gate
        self.ticket = ticket

    @property
    def released(self) -> bool:
        return self.ticket.state is not TicketState.ADMITTED

    def release(self) -> None:
        """Return the permit and wake the next queued request; later calls do nothing."""
        self._gate._release(self.ticket)

    async def __aenter__(self) -> Permit:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class AsyncAdmission:
    """Async front for one ``Admission``; owns the futures and deadline timers."""

    def __init__(self, admission: Admission,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.admission = admission
        self._clock = clock
        self._waiters: dict[Ticket, asyncio.Future[None]] = {}
        self._timers: dict[Ticket, asyncio.TimerHandle] = {}

    async def acquire(self, tenant: str, priority: str | None = None,
                      deadline_s: float | None = None, extra_queue: int = 0) -> Permit:
        """Wait until admitted and return the permit; raise ``Shed`` if shed.

        ``priority`` is the requested tier (None: the tenant's own; see
        ``Admission.submit``); an unknown tier raises ValueError at once.
        ``extra_queue``: queue places it may take beyond the bounds (``TieredQueue.push``).
        Changes the admission state; cancelling the await dequeues the request.
        """
        ticket = self.admission.submit(tenant, priority, self._clock(), deadline_s, extra_queue)
        self._shed_all(ticket.displaced)
        if ticket.state is TicketState.ADMITTED:
            return Permit(self, ticket)
        if ticket.state is TicketState.SHED:
            raise _shed_error(ticket)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._waiters[ticket] = fut
        delay = max(0.0, ticket.deadline - self._clock())
        self._timers[ticket] = loop.call_later(delay, self._on_deadline, ticket)
        try:
            await fut
        except BaseException:
            self._forget(ticket)
            if ticket.state is TicketState.QUEUED or ticket.state is TicketState.ADMITTED:
                self._release(ticket)  # dequeue, or hand a just-granted permit on
            raise
        return Permit(self, ticket)

    @asynccontextmanager
    async def slot(self, tenant: str, priority: str | None = None,
                   deadline_s: float | None = None) -> AsyncIterator[Permit]:
        """``acquire`` as a context manager; releases on exit (if not released already)."""
        permit = await self.acquire(tenant, priority, deadline_s)
        try:
            yield permit
        finally:
            permit.release()

    def observe_start(self, seconds: float) -> None:
        """One admission-to-first-token time, for the deadline check (``Admission``)."""
        self.admission.observe_start(seconds)

    def set_capacity(self, permits: int, servers: int | None = None) -> None:
        """Resize the permit pool to a lease and wake whoever new permits go to."""
        self._wake(self.admission.set_capacity(permits, self._clock(), servers))

    def snapshot(self) -> AdmissionSnapshot:
        """Counters and gauges from the pure controller. Changes nothing."""
        return self.admission.snapshot()

    # -- internals -----------------------------------------------------------
    def _release(self, ticket: Ticket) -> None:
        self._wake(self.admission.release(ticket, self._clock()))

    def _on_deadline(self, ticket: Ticket) -> None:
        self._timers.pop(ticket, None)
        if ticket.state is TicketState.QUEUED:
            # The timer may fire a hair early; judge at the deadline itself.
            now = max(self._clock(), ticket.deadline)
            self._shed_all(self.admission.expire(now))

    def _wake(self, handoff: Handoff) -> None:
        for t in handoff.admitted:
            fut = self._forget(t)
            if fut is not None and not fut.done():
                fut.set_result(None)
            # A done future means the waiter was cancelled; its handler
            # sees ADMITTED and releases the permit.
        self._shed_all(handoff.shed)

    def _shed_all(self, tickets: list[Ticket] | tuple[Ticket, ...]) -> None:
        for t in tickets:
            fut = self._forget(t)
            if fut is not None and not fut.done():
                fut.set_exception(_shed_error(t))

    def _forget(self, ticket: Ticket) -> asyncio.Future[None] | None:
        timer = self._timers.pop(ticket, None)
        if timer is not None:
            timer.cancel()
        return self._waiters.pop(ticket, None)


def _shed_error(ticket: Ticket) -> Shed:
    return Shed(ticket.retry_after_s or 1, str(ticket.reason))
