"""A request's place in admission: the ``Ticket``, its states, and ``Handoff``.

Lifecycle::

    QUEUED --pop--> ADMITTED --release--> RELEASED
      |  \\--release (caller gave up)--> CANCELLED
      \\--expired / displaced--> SHED
    (submit may also go straight to ADMITTED or SHED)

A ticket is hashable by identity, so it can be a permit holder and a queue
item. Only ``Admission`` changes a ticket; callers read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from .outcomes import ShedReason


class TicketState(StrEnum):
    QUEUED = "queued"
    ADMITTED = "admitted"  # holds a permit: the request may use the engine
    RELEASED = "released"  # permit returned (generation ended)
    CANCELLED = "cancelled"  # left the queue before admission (client went away)
    SHED = "shed"  # answer 429 with Retry-After: retry_after_s


@dataclass(eq=False)
class Ticket:
    id: int
    tenant: str
    tier: str  # the priority tier it is queued in (resolved by the config)
    weight: float  # its tenant's fair-queueing weight within the tier
    submitted_at: float
    deadline: float  # absolute time by which it must be admitted: its first-token deadline less the start estimate
    state: TicketState = TicketState.QUEUED
    admitted_at: float | None = None
    released_at: float | None = None
    reason: ShedReason | None = None  # set when SHED
    retry_after_s: int | None = None  # set when SHED; >= 1
    expected_wait_s: float = 0.0  # estimate at submit time (0 if admitted at once)
    # Tickets this submission pushed out of a full queue (now SHED): the
    # caller must answer them 429 as well. Only set on the submitted ticket.
    displaced: list[Ticket] = field(default_factory=list)

    @property
    def admitted(self) -> bool:
        return self.state is TicketState.ADMITTED

    @property
    def shed(self) -> bool:
        return self.state is TicketState.SHED

    @property
    def queue_time_s(self) -> float | None:
        """Seconds from submit to admission; None if never admitted."""
        return None if self.admitted_at is None else self.admitted_at - self.submitted_at


@dataclass
class Handoff:
    """What one call changed for *other* tickets: wake ``admitted``, answer ``shed`` 429."""

    admitted: list[Ticket] = field(default_factory=list)
    shed: list[Ticket] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.admitted or self.shed)
