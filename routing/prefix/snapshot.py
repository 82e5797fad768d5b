"""One request's view of shared routing state, fetched in one round trip.

The index and the pins live in Redis so every ingress replica sees the same
state. The policy, though, is pure and synchronous. The shell therefore reads
what one decision needs (the holders and fan-out of the prompt's blocks, the
session's pin) in one pipeline, hands the policy these in-memory views, and
writes the pin back afterwards. The views are the pure classes themselves,
filled with just that data, so the policy runs unchanged: `IndexSnapshot` (a
PrefixIndex of one prompt's blocks, defined with PrefixIndex in
routing/prefix/prefix_index.py, which builds it) and `pins_view` here.
"""

from __future__ import annotations

from routing.prefix.session_pins import SessionPins


def pins_view(ttl_s: float, session: str | None, pinned: str | None, now: float) -> SessionPins:
    """SessionPins holding the one fetched pin of `session` (if any)."""
    pins = SessionPins(ttl_s)
    if session is not None and pinned is not None:
        pins.pin(session, pinned, now)
    return pins
