"""What the fair queue and the admission controller answer: small frozen dataclasses.

Every shed request carries a ``ShedReason`` (a Prometheus label) and a
``retry_after_s`` of at least one second; the ingress turns both into a 429
with ``Retry-After``. Nothing here is ever a 5xx.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

T = TypeVar("T")


class ShedReason(StrEnum):
    DEADLINE = "deadline"  # expected wait exceeds the deadline (rejected at push)
    TENANT_QUEUE_FULL = "tenant_queue_full"
    QUEUE_FULL = "queue_full"
    DISPLACED = "displaced"  # pushed out of a full queue by a lighter tenant or a higher tier
    EXPIRED = "expired"  # deadline passed while queued


@dataclass(frozen=True)
class Admit(Generic[T]):
    """The item is queued. ``displaced`` items left the queue to make room."""

    expected_wait_s: float
    displaced: tuple[T, ...] = ()


@dataclass(frozen=True)
class Reject:
    """The item was not queued; answer 429 with ``Retry-After: retry_after_s``."""

    reason: ShedReason
    retry_after_s: int


@dataclass(frozen=True)
class Popped(Generic[T]):
    """``item`` to serve next (None if the queue is empty) and items that expired."""

    item: T | None
    expired: tuple[T, ...] = ()
