"""Round-trip times between sites, as measured by probes, and their expiry.

Every site probes every other site (many-to-many) and reports each round
trip with ``observe``. The map keeps, per ordered pair (src, dst), a
smoothed RTT (an EWMA with weight ``alpha`` on the newest probe) and when it
was last seen. An entry not refreshed for ``ttl_s`` has *expired*: it is
ignored by every reader, so a site that stops answering probes drops out of
its peers' neighbour lists after ``ttl_s`` without anybody announcing it,
and rejoins with its next answered probe. A probe arriving after expiry
starts the average afresh (the old value says nothing about the new path).

Direction: ``rtt(a, b)`` is a's own measurement of b when fresh, otherwise
b's measurement of a (round trips are symmetric up to noise, and a site
that has not probed a peer yet can still use the peer's number).

Many-to-many without a shared store: a site's probe answer carries its own
row (``neighbours``), and the prober ``observe``s each entry of it
(deployments/sites/site_link.py). Pure: no clock and no I/O; the caller passes
``now`` in seconds.
"""

from __future__ import annotations

import math


class LatencyMap:
    """Smoothed, expiring RTTs between named sites."""

    def __init__(self, ttl_s: float, alpha: float = 0.3) -> None:
        if not ttl_s > 0 or math.isinf(ttl_s):
            raise ValueError("ttl_s must be > 0 and finite")
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        self.ttl_s = float(ttl_s)
        self.alpha = float(alpha)
        self._rows: dict[str, dict[str, tuple[float, float]]] = {}  # src -> dst -> (rtt_s, seen)

    def observe(self, src: str, dst: str, rtt_s: float, now: float) -> None:
        """Records one probe from ``src`` to ``dst`` that took ``rtt_s`` seconds at ``now``.

        Changes the (src, dst) entry: its RTT becomes the EWMA of the old one
        and ``rtt_s`` (or ``rtt_s`` alone when the entry is new or expired),
        its time seen becomes ``now`` (never moved backwards). Raises
        ValueError on a negative or non-finite RTT or on src == dst.
        """
        if src == dst:
            raise ValueError("a site does not probe itself")
        if not 0.0 <= rtt_s < math.inf:
            raise ValueError(f"rtt_s must be finite and >= 0, got {rtt_s}")
        row = self._rows.setdefault(src, {})
        old = row.get(dst)
        if old is None or self._expired(old[1], now):
            row[dst] = (float(rtt_s), now)
        else:
            row[dst] = ((1.0 - self.alpha) * old[0] + self.alpha * rtt_s, max(old[1], now))

    def rtt(self, src: str, dst: str, now: float) -> float | None:
        """Smoothed RTT from ``src`` to ``dst`` in seconds; 0.0 to itself; None if never seen or expired.

        Reads only. ``src``'s own measurement is preferred; ``dst``'s of
        ``src`` stands in when ``src``'s is missing or expired.
        """
        if src == dst:
            return 0.0
        for a, b in ((src, dst), (dst, src)):
            entry = self._rows.get(a, {}).get(b)
            if entry is not None and not self._expired(entry[1], now):
                return entry[0]
        return None

    def neighbours(self, src: str, now: float) -> list[tuple[str, float]]:
        """Every other site with an unexpired RTT from ``src``, as (site, rtt_s), nearest first.

        Ties are broken by name, so the order is deterministic. Reads only.
        """
        names = set(self._rows.get(src, ()))
        names.update(a for a, row in self._rows.items() if src in row)
        names.discard(src)
        out = []
        for name in names:
            r = self.rtt(src, name, now)
            if r is not None:
                out.append((name, r))
        out.sort(key=lambda e: (e[1], e[0]))
        return out

    def sites(self, now: float) -> set[str]:
        """Sites that appear in at least one unexpired entry (as prober or probed). Reads only."""
        out: set[str] = set()
        for src, row in self._rows.items():
            for dst, (_, seen) in row.items():
                if not self._expired(seen, now):
                    out.update((src, dst))
        return out

    def _expired(self, seen: float, now: float) -> bool:
        return now - seen > self.ttl_s
