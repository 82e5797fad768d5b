"""An engine's measured speeds, fitted from its own steps.

Each engine step computes some tokens (prompt chunks and one token per
running sequence) and may load some prompt tokens from the KV pool before
it runs. On every step the engine hands `StepFit.observe` what the step did
and how long it took; the fit keeps an exponentially weighted least-squares
line

    step seconds = base + compute × tokens computed + load × tokens loaded

and reports `compute` and `load` per token: the prefill rate and the pool's
load rate that routing/policy/cost.py prices a candidate with. The same policy is
then right on a slow CPU, a fast CPU and a GPU: nothing is a constant tuned
on one machine.

Pure logic: no clock, no engine; the caller passes each step's duration.
"""

from __future__ import annotations

from dataclasses import dataclass

_DIMS = 3  # base, computed, loaded


@dataclass(frozen=True)
class StepRates:
    """Seconds per token computed, per token loaded from the pool, and per step."""

    compute_s_per_token: float
    load_s_per_token: float
    base_s: float
    steps: int


class StepFit:
    """Exponentially weighted least squares of step time on (1, computed, loaded).

    ``half_life`` steps: a step that many steps ago weighs half as much as the
    latest, so the fit follows a machine whose speed changes (another
    process taking a core) within seconds. ``ridge`` keeps the solve defined
    before both token kinds have been seen (a pool that never loads reports a
    load rate of 0, not noise). The first ``warmup`` steps that ran the model
    are not fitted: an engine's first forward initialises lazily (the tiny
    model on CPU: 41 ms for 14 tokens, where the same step takes 2 ms next),
    and among a few decode steps that one step alone set the per-token rate
    600x too high, which moved a session off the replica holding its prefix.
    """

    def __init__(self, half_life: float = 200.0, ridge: float = 1e-6, warmup: int = 1) -> None:
        if half_life <= 0:
            raise ValueError("half_life must be > 0")
        self.decay = 0.5 ** (1.0 / half_life)
        self.ridge = ridge
        self.warmup = warmup
        self.steps = 0
        self._xtx = [[0.0] * _DIMS for _ in range(_DIMS)]
        self._xty = [0.0] * _DIMS

    def observe(self, seconds: float, computed_tokens: int, loaded_tokens: int = 0) -> None:
        """Adds one step. Changes the fit, or only counts down the warm-up; ignores steps that
        computed and loaded nothing."""
        if seconds < 0 or computed_tokens < 0 or loaded_tokens < 0:
            raise ValueError("a step's time and token counts must be >= 0")
        if computed_tokens == 0 and loaded_tokens == 0:
            return
        if self.warmup > 0:
            self.warmup -= 1
            return
        # Tokens in thousands keep the normal equations well conditioned.
        x = (1.0, computed_tokens / 1000.0, loaded_tokens / 1000.0)
        d = self.decay
        for i in range(_DIMS):
            self._xty[i] = d * self._xty[i] + x[i] * seconds
            row = self._xtx[i]
            for j in range(_DIMS):
                row[j] = d * row[j] + x[i] * x[j]
        self.steps += 1

    def rates(self) -> StepRates | None:
        """The current fit, or None before any step. Rates are clipped at 0."""
        if self.steps == 0:
            return None
        a = [[self._xtx[i][j] + (self.ridge if i == j else 0.0) for j in range(_DIMS)] + [self._xty[i]]
             for i in range(_DIMS)]
        coef = _solve(a)
        if coef is None:
            return None
        base, compute, load = coef
        return StepRates(max(0.0, compute) / 1000.0, max(0.0, load) / 1000.0, max(0.0, base), self.steps)


def median_rate(engines, field: str) -> float:
    """The median of `field` over the engines (heartbeat dicts) that report it; 0 when none does.

    Routing prices every candidate of a pool at its median prefill rate (request_routing.py): a
    pool is one model on one GPU type, and one engine's fit after a few dozen steps, mostly
    decode, is noise (two identical CPU engines measured 0.06 and 0.31 ms per token, and the
    pinned one's five-fold "slowness" moved a session off its prefix). An engine that is slower
    for real shows it where it counts: in its queue and its oldest wait."""
    rates = sorted(float(e[field]) for e in engines if e.get(field))
    if not rates:
        return 0.0
    mid = len(rates) // 2
    return rates[mid] if len(rates) % 2 else (rates[mid - 1] + rates[mid]) / 2


def mean_rate(engines, field: str) -> float:
    """The mean of `field` over the engines (heartbeat dicts) that report it; 0 when none does.

    Routing prices the Mooncake store's loads at the mean load rate of every live engine that
    has loaded: a load's speed is the store's and the wire's. An engine that never loaded (a
    prefill engine whose sessions never moved) reports none, and a guessed rate would decide
    its first move."""
    rates = [float(e[field]) for e in engines if e.get(field)]
    return sum(rates) / len(rates) if rates else 0.0


def _solve(a: list[list[float]]) -> list[float] | None:
    """Gauss-Jordan with partial pivoting on an augmented n x (n+1) matrix; None if singular."""
    n = len(a)
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-15:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        p = a[col][col]
        a[col] = [v / p for v in a[col]]
        for r in range(n):
            if r != col and a[r][col] != 0.0:
                f = a[r][col]
                a[r] = [v - f * w for v, w in zip(a[r], a[col])]
    return [a[r][n] for r in range(n)]
