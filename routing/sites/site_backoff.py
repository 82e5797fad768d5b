"""Backoff from sites that refuse: skipped for a while, longer each refusal in a row.

Pure: no clock (``now`` passed in), no I/O; used by routing/sites/site_select.py.
"""

from __future__ import annotations


class Backoff:
    """Sites that refused recently and until when they are skipped."""

    def __init__(self, base_s: float, max_s: float) -> None:
        self.base_s = base_s
        self.max_s = max_s
        self._state: dict[str, tuple[int, float, float]] = {}  # site -> (refusals in a row, until, last at)

    def refused(self, site: str, now: float) -> float:
        """Counts a refusal and skips ``site`` for base * 2**(refusals-1), capped; returns that duration."""
        n = self._state.get(site, (0, now, now))[0] + 1
        span = min(self.base_s * 2.0 ** min(n - 1, 60), self.max_s)
        self._state[site] = (n, now + span, now)
        return span

    def served(self, site: str) -> None:
        """Ends ``site``'s backoff and forgets its refusals."""
        self._state.pop(site, None)

    def heard_since(self, site: str, as_of: float | None) -> bool:
        """Whether a view of ``site`` heard at ``as_of`` (None: unknown, older than any refusal) came
        after its last refusal (True when it never refused). Reads only."""
        state = self._state.get(site)
        return state is None or (as_of is not None and as_of > state[2])

    def active(self, site: str, now: float) -> bool:
        """True while ``site`` is skipped. Reads only."""
        state = self._state.get(site)
        return state is not None and now < state[1]
