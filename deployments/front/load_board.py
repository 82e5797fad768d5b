"""Each live replica's load as a front's routing decision sees it, kept between decisions.

A decision at 64 replicas built 64 `ReplicaLoad`s from the registry and the
counts (a sixth of a decision in `baton bench scale --part control`), though
between two decisions almost none of them changes. A `LoadBoard` keeps one
pool's and rebuilds only:
- every replica, when the shared view was read again (a new registry or new
  counts from the other fronts, deployments/front/shared_view.py): every
  `routing.shared_state_ms` at most;
- a replica whose count on this front changed since the last decision (a
  request started or ended there, its prompt was computed: `Tally.touched`);
- a replica whose live-session count differs in a decision that places a new
  session (where no placement was read, the last counts stay: only a
  placement reads them);
- not at all, a replica whose engine reported a request waiting while this
  front's view shows one running there: its wait grows with the clock, and
  the board sets that one field of its load in place.

Pure logic: no I/O, time passed in.
"""

from __future__ import annotations

from collections import Counter

from routing.policy.contracts import ReplicaLoad


class Tally(Counter):
    """A Counter that records in `touched` each key set or deleted since the caller emptied it."""

    def __init__(self) -> None:
        self.touched: set = set()
        super().__init__()

    def __setitem__(self, key, value) -> None:
        self.touched.add(key)
        super().__setitem__(key, value)

    def __delitem__(self, key) -> None:
        self.touched.add(key)
        super().__delitem__(key)


def replica_wait(entry: dict, now: float) -> float:
    """How long the replica's oldest unscheduled request has waited by `now`: its engine's figure
    at the heartbeat, plus the heartbeat's age while anything was waiting."""
    wait = float(entry.get("oldest_wait_s") or 0.0)
    return wait + max(0.0, now - entry["ts"]) if entry.get("waiting") else wait


class LoadBoard:
    """One pool's loads on one front. `mine` and `queued` are this front's own in-flight requests
    and queued prefill blocks per replica (Tallies the front changes); `update` reads them."""

    def __init__(self, mine: Tally, queued: Tally) -> None:
        self.mine, self.queued = mine, queued
        self.loads: dict[str, ReplicaLoad] = {}
        self._key: tuple | None = None  # the inputs `loads` was built from, by identity
        self._timed: dict[str, tuple] = {}  # replicas whose wait grows with the clock: (wait at beat, beat)
        self._sessions: dict[str, int] = {}

    def update(self, live: dict[str, dict], names: list[str], base: dict[str, tuple], theirs: dict,
               seen: dict, sessions: dict[str, int], now: float) -> dict[str, ReplicaLoad]:
        """The loads of `names` (the live replicas `live`, in name order) at `now`, and keeps them.

        `base`: per replica (capacity, free KV blocks, seconds per block computed, per block
        loaded), derived from `live`; `theirs` and `seen`: every front's in-flight requests and
        queued prefill blocks per replica from the shared view; `sessions`: live sessions per
        replica where this decision read a placement, else empty. Running is every live front's
        requests there, or this front's if more (its writes may not have landed), not the engine's
        heartbeat count, which moved sessions off replicas that had drained; nothing waits
        where no front has a request in flight: a beat still showing one waiting is the
        session's previous turn. Changes the board and empties the tallies' `touched`; the dict
        returned is the board's own, changed in place by later updates."""
        stale = self.mine.touched | self.queued.touched
        self.mine.touched.clear()
        self.queued.touched.clear()
        if sessions and sessions != self._sessions:
            stale.update(n for n, _ in sessions.items() - self._sessions.items())  # the pairs that differ
            self._sessions = dict(sessions)
        key = (live, base, theirs, seen)
        if self._key is None or any(a is not b for a, b in zip(key, self._key)):
            self._key, self.loads, self._timed = key, {}, {}
            stale = names  # all, in name order
        else:
            stale.intersection_update(live)
        for n in stale:
            self.loads[n] = self._load(n, live[n], base[n], theirs, seen, now)
        loads = self.loads
        for n, (wait, ts) in self._timed.items():  # a sixth of 64 replicas in the control bench
            loads[n].oldest_wait_s = wait + (now - ts if now > ts else 0.0)
        return loads

    def _load(self, n: str, entry: dict, base: tuple, theirs: dict, seen: dict, now: float) -> ReplicaLoad:
        running = max(self.mine.get(n, 0), theirs.get(n, 0))
        capacity, free, prefill_rate, load_rate = base
        queued, ahead = self.queued.get(n, 0.0), seen.get(n, 0.0)
        if running and entry.get("waiting"):
            self._timed[n] = (float(entry.get("oldest_wait_s") or 0.0), entry["ts"])
        else:
            self._timed.pop(n, None)
        # running, queued, free, capacity, alive, pending, oldest wait, sessions, queued prefill, rates
        return ReplicaLoad(running, 0, free, capacity, True, 0.0, replica_wait(entry, now) if running else 0.0,
                           self._sessions.get(n, 0), ahead if ahead > queued else queued, prefill_rate, load_rate)
