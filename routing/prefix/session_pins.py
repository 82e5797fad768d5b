"""Soft session pins: session id -> replica, with a time-to-live.

A pin is a preference, not a lock: the policy decides when to break it (the
pinned replica is overloaded or dead) and then re-pins the session to the
replica it chose. Every read or write of a pin refreshes its TTL, so an active
conversation keeps its pin and an abandoned one expires.

Pure: time comes in as ``now`` (seconds). The production store is Redis with
the same semantics (``SET key replica EX ttl``); this class is the reference
and the in-process implementation.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass
class _Pin:
    replica: str
    expires_at: float


class SessionPins:
    """Session -> replica pins with TTL and a re-pin counter."""

    def __init__(self, ttl_s: float = 600.0) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self.ttl_s = ttl_s
        self.repins = 0  # pins moved from one live replica entry to another
        self._pins: dict[str, _Pin] = {}
        self._held: Counter[str] = Counter()  # replica -> pins held, expired ones not yet dropped included

    def _set(self, session: str, pin: _Pin) -> None:
        old = self._pins.get(session)
        if old is not None:
            self._held[old.replica] -= 1
        self._pins[session] = pin
        self._held[pin.replica] += 1

    def _drop(self, session: str) -> None:
        self._held[self._pins.pop(session).replica] -= 1

    def held(self, replica: str) -> int:
        """Pins to ``replica``, counting expired ones until a read or ``expire`` drops them. Changes nothing."""
        return self._held.get(replica, 0)

    def get(self, session: str, now: float) -> str | None:
        """Return the pinned replica, or None if absent or expired.

        Changes: drops the pin if it expired; otherwise refreshes its TTL.
        """
        pin = self._pins.get(session)
        if pin is None:
            return None
        if pin.expires_at <= now:
            self._drop(session)
            return None
        pin.expires_at = now + self.ttl_s
        return pin.replica

    def pin(self, session: str, replica: str, now: float) -> bool:
        """Pin ``session`` to ``replica`` until ``now + ttl``.

        Returns True when this moved an unexpired pin to a different replica
        (a re-pin); the re-pin counter is then incremented.
        """
        old = self._pins.get(session)
        moved = old is not None and old.expires_at > now and old.replica != replica
        if moved:
            self.repins += 1
        self._set(session, _Pin(replica, now + self.ttl_s))
        return moved

    def peek(self, session: str, now: float) -> str | None:
        """The pinned replica, or None if absent or expired at ``now``. Changes nothing."""
        pin = self._pins.get(session)
        return pin.replica if pin is not None and pin.expires_at > now else None

    def expires_at(self, session: str) -> float | None:
        """When the session's pin expires (it may have already), or None without one. Changes nothing."""
        pin = self._pins.get(session)
        return pin.expires_at if pin is not None else None

    def put(self, session: str, replica: str, expires_at: float) -> None:
        """Sets the pin as another holder of the pins wrote it: to ``replica`` until ``expires_at``
        (a copy kept from a feed). Counts no re-pin."""
        self._set(session, _Pin(replica, expires_at))

    def expire(self, now: float) -> int:
        """Drop every pin expired at ``now``; return how many were dropped."""
        dead = [s for s, p in self._pins.items() if p.expires_at <= now]
        for s in dead:
            self._drop(s)
        return len(dead)

    def forget_replica(self, replica: str) -> int:
        """Drop every pin to ``replica`` (it died or left); return how many."""
        dead = [s for s, p in self._pins.items() if p.replica == replica]
        for s in dead:
            self._drop(s)
        return len(dead)

    def __len__(self) -> int:
        return len(self._pins)
