"""One request's view of shared routing state, fetched in one round trip.

The index and the pins live in Redis so every ingress replica sees the same
state. The policy, though, is pure and synchronous. The shell therefore reads
what one decision needs (the holders and fan-out of the prompt's blocks, the
session's pin) in one pipeline, hands the policy these in-memory views, and
writes the pin back afterwards. The views are the pure classes themselves,
filled with just that data, so the policy runs unchanged.
"""

from __future__ import annotations

from typing import Sequence

from routing.prefix_index import PrefixIndex
from routing.session_pins import SessionPins


class IndexSnapshot(PrefixIndex):
    """A PrefixIndex holding only the blocks of one prompt, as fetched."""

    def __init__(self, block_hashes: Sequence[int], holders: Sequence[set[str]],
                 fanouts: Sequence[int]) -> None:
        super().__init__()
        for h, replicas in zip(block_hashes, holders):
            for r in replicas:
                self.apply_stored(r, [h])
        self._fanouts = dict(zip(block_hashes, fanouts))

    def fanout(self, block_hash: int) -> int:
        return self._fanouts.get(block_hash, 0)

    def shared_prefix_len(self, block_hashes: Sequence[int], min_fanout: int) -> int:
        n = 0
        for h in block_hashes:
            if self._fanouts.get(h, 0) < min_fanout:
                break
            n += 1
        return n


def pins_view(ttl_s: float, session: str | None, pinned: str | None, now: float) -> SessionPins:
    """SessionPins holding the one fetched pin of `session` (if any)."""
    pins = SessionPins(ttl_s)
    if session is not None and pinned is not None:
        pins.pin(session, pinned, now)
    return pins
