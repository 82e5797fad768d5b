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


class SessionPins:
    """Session -> replica pins with TTL and a re-pin counter.

    Two dicts of strings and floats, not an object per pin: Python's cyclic collector tracks
    neither (a front keeps every live session's pins, deployments/front/pin_feed.py; 200k pins as
    objects, with a full hash memo, were 22 ms of each full collection, which stops the front while
    it runs: 1.2 ms as dicts, with the memo's hashes as tuples)."""

    def __init__(self, ttl_s: float = 600.0) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self.ttl_s = ttl_s
        self.repins = 0  # pins moved from one live replica entry to another
        self._replica: dict[str, str] = {}  # session -> its replica
        self._expires: dict[str, float] = {}  # session -> when its pin expires
        self._held: Counter[str] = Counter()  # replica -> pins held, expired ones not yet dropped included

    def _set(self, session: str, replica: str, expires_at: float) -> None:
        old = self._replica.get(session)
        if old is not None:
            self._held[old] -= 1
        self._replica[session], self._expires[session] = replica, expires_at
        self._held[replica] += 1

    def _drop(self, session: str) -> None:
        del self._expires[session]
        self._held[self._replica.pop(session)] -= 1

    def held(self, replica: str) -> int:
        """Pins to ``replica``, counting expired ones until a read or ``expire`` drops them. Changes nothing."""
        return self._held.get(replica, 0)

    def get(self, session: str, now: float) -> str | None:
        """Return the pinned replica, or None if absent or expired.

        Changes: drops the pin if it expired; otherwise refreshes its TTL.
        """
        replica = self._replica.get(session)
        if replica is None:
            return None
        if self._expires[session] <= now:
            self._drop(session)
            return None
        self._expires[session] = now + self.ttl_s
        return replica

    def pin(self, session: str, replica: str, now: float) -> bool:
        """Pin ``session`` to ``replica`` until ``now + ttl``.

        Returns True when this moved an unexpired pin to a different replica
        (a re-pin); the re-pin counter is then incremented.
        """
        old = self._replica.get(session)
        moved = old is not None and self._expires[session] > now and old != replica
        if moved:
            self.repins += 1
        self._set(session, replica, now + self.ttl_s)
        return moved

    def peek(self, session: str, now: float) -> str | None:
        """The pinned replica, or None if absent or expired at ``now``. Changes nothing."""
        replica = self._replica.get(session)
        return replica if replica is not None and self._expires[session] > now else None

    def expires_at(self, session: str) -> float | None:
        """When the session's pin expires (it may have already), or None without one. Changes nothing."""
        return self._expires.get(session)

    def put(self, session: str, replica: str, expires_at: float) -> None:
        """Sets the pin as another holder of the pins wrote it: to ``replica`` until ``expires_at``
        (a copy kept from a feed). Counts no re-pin."""
        self._set(session, replica, expires_at)

    def expire(self, now: float) -> int:
        """Drop every pin expired at ``now``; return how many were dropped."""
        dead = [s for s, t in self._expires.items() if t <= now]
        for s in dead:
            self._drop(s)
        return len(dead)

    def forget_replica(self, replica: str) -> int:
        """Drop every pin to ``replica`` (it died or left); return how many."""
        dead = [s for s, r in self._replica.items() if r == replica]
        for s in dead:
            self._drop(s)
        return len(dead)

    def __len__(self) -> int:
        return len(self._replica)
