"""Which models of an overcommitted catalogue have a running engine.

One engine pool hosts a catalogue whose memory budgets may add up to several
times what the pool has. Only models that fit are resident; the rest are
listed and woken on demand, evicting others. `Residency` keeps the resident
set and each model's recent demand, and `plan` says what waking a model
would take:

* The hot set (`favoured`) is the most wanted models, by demand over a
  memory ``LONG_MEMORY`` times the half-life, that fit together with room
  left for the largest model to wake beside them. It is evicted last: the
  room beside it turns over among the others, so a hot model is never a
  victim while the hot set stands. Ranked by the short demand alone, the
  second hottest model (a fifth of the traffic) fell below a cold model
  that had just been asked several times, was evicted, and its p95 TTFT
  became a wake's 4.6 s (bench models, 2x).
* Victims are the other resident models, least demand first (ties: least
  recently used, then name), then the hot set's. When those victims may
  not go yet (too recently woken, or busy: requests in flight, never cut
  off), the plan waits for them rather than evicting a more wanted model
  that could go now; a busy victim is looked at again every
  ``BUSY_RECHECK_S``.
* Hysteresis: a model resident for less than ``min_resident_s`` is never a
  victim, so two models alternating on room for one swap at most once per
  ``min_resident_s``.
* Demand guard: a victim whose decayed demand is more than twice the
  requester's is never evicted unless it has been idle (no request) for
  ``min_resident_s``: a rarely used model waits for room among the rarely
  used, or for the wanted ones to go quiet, rather than evicting a model in
  steady use (whose next requests would all pay a wake). Models of similar
  demand take turns (at most one swap per ``min_resident_s``), so none
  starves. Both demands decay at the same half-life, so their
  ratio does not change with time alone; such a victim frees up only once
  it has been idle that long.

The replica runs the hot set's engines at full CPU priority and the others
below them (deployments/catalogue/model_host.py), so a cold model's requests are
served in what the hot ones leave.

Pure logic: no clock, no engine; the caller passes ``now`` in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BUSY_RECHECK_S = 0.5  # how soon a plan waiting on a busy victim looks again
_DEMAND_GUARD = 2.0  # a victim more than twice as wanted as the requester is kept while in use
LONG_MEMORY = 10.0  # the hot set's demand forgets this many times more slowly than the victims' order


@dataclass(frozen=True)
class Plan:
    """What waking one model takes.

    ``wake``: the model to start (None if already resident or it cannot be
    placed now). ``evict``: resident models to stop first, in order.
    ``wait_s``: 0 if the model can wake now, else seconds until enough
    victims become evictable (math.inf if time alone never frees enough).
    ``reason``: "resident" | "fits" | "evict" | "pinned" | "too_big".
    """

    wake: str | None
    evict: tuple[str, ...]
    wait_s: float
    reason: str


class Residency:
    """The resident set of one engine pool and each model's decayed demand."""

    def __init__(self, capacity_bytes: int, budgets: dict[str, int],
                 min_resident_s: float = 30.0, half_life_s: float = 60.0) -> None:
        if capacity_bytes < 0 or any(b < 0 for b in budgets.values()):
            raise ValueError("capacity and budgets must be >= 0")
        if min_resident_s < 0 or half_life_s <= 0:
            raise ValueError("min_resident_s must be >= 0 and half_life_s > 0")
        self.capacity = capacity_bytes
        self.budgets = dict(budgets)
        self.min_resident_s = min_resident_s
        self.half_life_s = half_life_s
        self._count: dict[str, tuple[float, float]] = {}  # model -> (decayed count, as of)
        self._long: dict[str, tuple[float, float]] = {}  # the same at LONG_MEMORY x the half-life
        self._last_request: dict[str, float] = {}
        self._since: dict[str, float] = {}  # resident model -> woken at, in wake order

    def request(self, model: str, now: float) -> None:
        """Records one arrival for ``model``: raises its demand and its last-request time."""
        self._check(model)
        self._count[model] = (self._decayed_count(model, now) + 1.0, now)
        self._long[model] = (self._decayed_count(model, now, long=True) + 1.0, now)
        self._last_request[model] = now

    def demand(self, model: str, now: float) -> float:
        """Decayed request rate (requests/s); halves every ``half_life_s`` without requests."""
        self._check(model)
        return self._decayed_count(model, now) * math.log(2) / self.half_life_s

    def woke(self, model: str, now: float) -> None:
        """Marks ``model`` resident since ``now`` (a resident one restarts its clock).

        Raises ValueError if its budget does not fit the free bytes.
        """
        self._check(model)
        if model not in self._since and self.budgets[model] > self.free_bytes():
            raise ValueError(f"{model} needs {self.budgets[model]} bytes, "
                             f"{self.free_bytes()} free")
        self._since[model] = now

    def evicted(self, model: str) -> None:
        """Marks ``model`` not resident (no change if it was not)."""
        self._check(model)
        self._since.pop(model, None)

    def resident(self) -> list[str]:
        """Resident models, in wake order."""
        return list(self._since)

    def favoured(self, now: float) -> set[str]:
        """The hot set's resident models: the most wanted (demand over LONG_MEMORY half-lives, then
        name) that fit together while leaving room for the largest model to wake beside them. Every
        resident one where the whole catalogue fits or nothing has been asked. Changes nothing."""
        if sum(self.budgets.values()) <= self.capacity:
            return set(self._since)
        demand = {m: self._decayed_count(m, now, long=True) for m in self.budgets}
        if not any(demand.values()):
            return set(self._since)
        room, used, out = self.capacity - max(self.budgets.values()), 0, set()
        for m in sorted(self.budgets, key=lambda m: (-demand[m], m)):
            if demand[m] <= 0 or used + self.budgets[m] > room:
                break
            used += self.budgets[m]
            out.add(m)
        return out & set(self._since)

    def used_bytes(self) -> int:
        return sum(self.budgets[m] for m in self._since)

    def free_bytes(self) -> int:
        return self.capacity - self.used_bytes()

    def plan(self, model: str, now: float, busy: set[str] | frozenset[str] = frozenset()) -> Plan:
        """What waking ``model`` at ``now`` takes. Changes nothing.

        ``busy``: resident models with requests in flight; they are never evicted while busy.
        """
        self._check(model)
        if model in self._since:
            return Plan(None, (), 0.0, "resident")
        budget = self.budgets[model]
        if budget > self.capacity:
            return Plan(None, (), math.inf, "too_big")
        need = budget - self.free_bytes()
        if need <= 0:
            return Plan(model, (), 0.0, "fits")
        ready = self._evictable_at(model, now, busy)
        victims = self._victims(now, list(ready), need)
        if victims is None:  # even every idle resident together is too little
            return Plan(None, (), math.inf, "pinned")
        at = max(ready[v] for v in victims)
        if at <= now:
            return Plan(model, victims, 0.0, "evict")
        return Plan(None, (), at - now, "pinned")

    def _evictable_at(self, model: str, now: float, busy: set[str] | frozenset[str]) -> dict[str, float]:
        """Each resident model -> the earliest time it may be evicted for ``model`` (a busy one: when
        it is next looked at)."""
        mine = self.demand(model, now)
        out: dict[str, float] = {}
        for v, since in self._since.items():
            if v in busy:
                out[v] = now + BUSY_RECHECK_S
                continue
            t = since + self.min_resident_s
            if self.demand(v, now) > _DEMAND_GUARD * mine:
                # The ratio is fixed under decay: only going idle releases it.
                t = max(t, self._last_request.get(v, -math.inf) + self.min_resident_s)
            out[v] = t
        return out

    def _victims(self, now: float, candidates: list[str], need: int) -> tuple[str, ...] | None:
        """The hot set last, else least demand first (then least recently used, then name) until
        ``need`` bytes; None if short."""
        hot = self.favoured(now)
        order = sorted(candidates, key=lambda v: (v in hot, self.demand(v, now), self._last_used(v), v))
        chosen: list[str] = []
        freed = 0
        for v in order:
            if freed >= need:
                break
            chosen.append(v)
            freed += self.budgets[v]
        return tuple(chosen) if freed >= need else None

    def _last_used(self, model: str) -> float:
        return max(self._last_request.get(model, -math.inf), self._since.get(model, -math.inf))

    def _decayed_count(self, model: str, now: float, long: bool = False) -> float:
        count, at = (self._long if long else self._count).get(model, (0.0, now))
        return count * 0.5 ** (max(0.0, now - at) / (self.half_life_s * (LONG_MEMORY if long else 1.0)))

    def _check(self, model: str) -> None:
        if model not in self.budgets:
            raise KeyError(model)
