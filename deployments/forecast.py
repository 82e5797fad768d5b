"""Forecasters of one load signal (e.g. a pool's arrival rate), all with one interface.

`observe(t, value)` feeds a sample taken at time `t` (seconds, any clock, never
read here); `predict(horizon_s)` says what the signal will be `horizon_s` after
the last closed bin. Callers sample irregularly (Serve's control loop runs every
0.1 s, the simulator every step), so observations are averaged into bins of
`step_s` seconds; a bin with no sample repeats the previous one. Models fit the
last `window` closed bins.

* `ConstantForecaster`: the mean of the last `span` bins, flat over any
  horizon (the persistence baseline).
* `LastValueForecaster`: the latest raw sample, what a reactive policy acts on.
* `HoltForecaster`: Holt's damped-trend exponential smoothing, ETS(A,Ad,N).
  Its parameters are fit by least squares every `refit_s`; in between each new
  bin re-runs the smoother with those parameters.
* `KalmanForecaster`: a local linear trend state-space model, a Kalman filter
  whose noise variances are fit by likelihood every `refit_s`, re-filtered with
  them on each new bin. Both give the forecast's standard error, so
  `predict(h, z)` can return an upper quantile.

Both models are numpy alone (a grid of parameter sets scored in one vectorised
pass, not an optimiser). They were statsmodels' `ExponentialSmoothing` and
`UnobservedComponents` until statsmodels was dropped for bringing scipy into
every process's environment (vLLM's engine imports load scipy whenever it is
installed) on the evidence of one `bench serve` run; the serving path's loss
turned out to be the engines' spin cap (deployments/app.py), so that reason
does not stand measured (docs/benchmarks.md, "Check after issues 33-35").
Model work happens when a bin closes: one fit per `refit_s`, one pass and one
forecast path (up to `max_horizon_s`) per bin, whatever the caller's sample
rate; `predict` reads the stored path.
Pure logic: no clock, no Ray.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

MIN_FIT_BINS = 24  # fewer bins than this: models fall back to the recent mean
TREND = "local linear trend"


class Forecaster:
    """Bins the samples; subclasses forecast from the closed bins."""

    name = "base"

    def __init__(self, step_s: float = 5.0, window: int = 120) -> None:
        self.step_s = step_s
        self.bins: deque[float] = deque(maxlen=window)
        self._bin: int | None = None  # index of the open bin
        self._sum = 0.0
        self._n = 0
        self.last = 0.0  # latest raw sample
        self.t = 0.0  # time of the latest sample

    def observe(self, t: float, value: float) -> None:
        """Adds one sample: averaged into the open bin; closes the bins `t` has passed,
        and lets the model update on each (`_closed`)."""
        idx = int(math.floor(t / self.step_s))
        if self._bin is None:
            self._bin = idx
        while idx > self._bin:  # close the open bin, repeat it over empty ones
            value_closed = self._sum / self._n if self._n else (self.bins[-1] if self.bins else value)
            self.bins.append(value_closed)
            self._bin += 1
            self._sum, self._n = 0.0, 0
            if idx == self._bin:
                self._closed(self._bin * self.step_s)
        self._sum += value
        self._n += 1
        self.last, self.t = value, t

    def recent(self, span: int = 3) -> float:
        """Mean of the last `span` closed bins (the latest sample before any bin closes)."""
        if not self.bins:
            return self.last
        tail = list(self.bins)[-span:]
        return sum(tail) / len(tail)

    def _closed(self, t: float) -> None:
        """Called once the bins up to `t` are closed; changes the model's state."""

    def predict(self, horizon_s: float, z: float = 0.0) -> float:
        """The signal `horizon_s` seconds ahead (never negative); `z` > 0 asks for the
        mean plus `z` standard errors where the model has them. Changes nothing."""
        raise NotImplementedError


class ConstantForecaster(Forecaster):
    """Tomorrow is like the last `span` bins: a flat forecast."""

    name = "constant"

    def __init__(self, step_s: float = 5.0, window: int = 120, span: int = 3) -> None:
        super().__init__(step_s, window)
        self.span = span

    def predict(self, horizon_s: float, z: float = 0.0) -> float:
        return max(0.0, self.recent(self.span))


class LastValueForecaster(Forecaster):
    """The latest raw sample, whatever the horizon (a reactive policy's view)."""

    name = "reactive"

    def predict(self, horizon_s: float, z: float = 0.0) -> float:
        return max(0.0, self.last)


class _FittedForecaster(Forecaster):
    """Refits every `refit_s`, re-applies the fitted parameters on every new bin.

    A fit scores a grid of parameter sets at once (numpy arrays over the grid,
    one pass over the window) and keeps the best; applying runs the same pass
    for the kept set alone. A few ms per fit on 120 bins.
    """

    def __init__(self, step_s: float = 5.0, window: int = 120, refit_s: float = 60.0,
                 max_horizon_s: float = 300.0) -> None:
        super().__init__(step_s, window)
        self.refit_s = refit_s
        self.steps = max(1, int(math.ceil(max_horizon_s / step_s)))
        self._fitted_at: float | None = None
        self._params: np.ndarray | None = None  # the fitted parameter set, shape (1, k)
        self._mean: np.ndarray | None = None  # forecast path, 1..steps bins ahead
        self._se: np.ndarray | None = None

    def _closed(self, t: float) -> None:
        if len(self.bins) < MIN_FIT_BINS:
            return
        y = np.asarray(self.bins, dtype=float)
        with np.errstate(all="ignore"):
            if self._params is None or t - self._fitted_at >= self.refit_s:
                grid = self._grid()
                score = self._score(y, grid)
                score[~np.isfinite(score)] = np.inf
                self._params = grid[[int(np.argmin(score))]]
                self._fitted_at = t
            mean, se = self._path(y, self._params, self.steps)
        if np.all(np.isfinite(mean)) and np.all(np.isfinite(se)):
            self._mean, self._se = mean, se  # a degenerate window keeps the last path

    def _grid(self) -> np.ndarray:
        """The parameter sets a fit scores, shape (n, k)."""
        raise NotImplementedError

    def _score(self, y: np.ndarray, grid: np.ndarray) -> np.ndarray:
        """Each parameter set's fit to `y`, lower is better, shape (n,)."""
        raise NotImplementedError

    def _path(self, y: np.ndarray, params: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Forecast mean and standard error 1..`steps` bins after `y` ends, with `params` (1, k)."""
        raise NotImplementedError

    def predict(self, horizon_s: float, z: float = 0.0) -> float:
        if self._mean is None:
            return max(0.0, self.recent())
        i = min(self.steps, max(1, int(math.ceil(horizon_s / self.step_s)))) - 1
        value = float(self._mean[i] + z * self._se[i])
        return max(0.0, value) if math.isfinite(value) else max(0.0, self.recent())


def _product(*axes: np.ndarray) -> np.ndarray:
    """Every combination of the axes' values, one per row."""
    return np.stack([a.ravel() for a in np.meshgrid(*axes, indexing="ij")], axis=1)


class HoltForecaster(_FittedForecaster):
    """Holt's damped additive trend, ETS(A,Ad,N), in error-correction form:
    forecast f = l + phi*b; e = y - f; l <- f + alpha*e; b <- phi*b + alpha*beta*e.
    Fit: least squares of the one-step errors over a grid of (alpha, beta, phi),
    started at the first value with the first difference as trend. The standard
    error h steps ahead is ETS(A,Ad,N)'s: sigma*sqrt(1 + sum_{j<h} (alpha*(1 + beta*phi_j))^2),
    phi_j = phi + ... + phi^j."""

    name = "holt"
    ALPHA = np.array([0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99])
    BETA = np.array([0.01, 0.05, 0.1, 0.2, 0.3, 0.5])
    PHI = np.array([0.8, 0.9, 0.95, 0.98, 1.0])

    def _grid(self) -> np.ndarray:
        return _product(self.ALPHA, self.BETA, self.PHI)

    @staticmethod
    def _run(y: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        alpha, beta, phi = p[:, 0], p[:, 1], p[:, 2]
        level = np.full(len(p), y[0])
        trend = np.full(len(p), y[1] - y[0])
        sse = np.zeros(len(p))
        for v in y[1:]:
            f = level + phi * trend
            e = v - f
            sse += e * e
            level = f + alpha * e
            trend = phi * trend + alpha * beta * e
        return level, trend, sse

    def _score(self, y: np.ndarray, grid: np.ndarray) -> np.ndarray:
        return self._run(y, grid)[2]

    def _path(self, y: np.ndarray, params: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
        level, trend, sse = self._run(y, params)
        alpha, beta, phi = params[0]
        damp = np.cumsum(phi ** np.arange(1, steps + 1))  # phi_h = phi + ... + phi^h
        sigma2 = float(sse[0]) / max(1, len(y) - 1)
        c2 = (alpha * (1.0 + beta * damp[:-1])) ** 2
        var = sigma2 * (1.0 + np.concatenate([[0.0], np.cumsum(c2)]))
        return level[0] + damp * trend[0], np.sqrt(var)


class KalmanForecaster(_FittedForecaster):
    """Local linear trend by Kalman filter: y = mu + eps, mu' = mu + nu + eta, nu' = nu + zeta.
    The variances are in units of eps's (the scale is estimated in closed form, a
    concentrated likelihood); a fit picks the (eta, zeta) ratios on a log grid by
    likelihood. The state starts diffuse and the first two bins are not scored.
    The standard error is the predicted observation's (state plus noise)."""

    name = "kalman"
    Q_LEVEL = np.logspace(-4, 1, 11)
    Q_SLOPE = np.logspace(-7, -1, 13)
    DIFFUSE = 1e6

    def _grid(self) -> np.ndarray:
        return _product(self.Q_LEVEL, self.Q_SLOPE)

    def _run(self, y: np.ndarray, q: np.ndarray):
        """Filters `y`; returns the one-step-ahead state (a, P) after it, the scale
        estimate and the concentrated log likelihood, each per parameter set."""
        n = len(q)
        a = np.zeros((n, 2))
        a[:, 0] = y[0]
        p00, p01, p11 = np.full(n, self.DIFFUSE), np.zeros(n), np.full(n, self.DIFFUSE)
        ssq, logdet = np.zeros(n), np.zeros(n)
        for t, v in enumerate(y):
            f = p00 + 1.0
            e = v - a[:, 0]
            k0, k1 = p00 / f, p01 / f
            if t >= 2:
                ssq += e * e / f
                logdet += np.log(f)
            a0, a1 = a[:, 0] + k0 * e, a[:, 1] + k1 * e
            u00, u01, u11 = p00 - k0 * p00, p01 - k0 * p01, p11 - k1 * p01
            a[:, 0], a[:, 1] = a0 + a1, a1
            p00, p01, p11 = u00 + 2 * u01 + u11 + q[:, 0], u01 + u11, u11 + q[:, 1]
        m = max(1, len(y) - 2)
        scale = ssq / m
        loglik = -0.5 * (logdet + m * np.log(np.maximum(scale, 1e-300)))
        return a, (p00, p01, p11), scale, loglik

    def _score(self, y: np.ndarray, grid: np.ndarray) -> np.ndarray:
        return -self._run(y, grid)[3]

    def _path(self, y: np.ndarray, params: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
        a, (p00, p01, p11), scale, _ = self._run(y, params)
        h = np.arange(steps, dtype=float)  # the filter's state is already one bin ahead
        mean = a[0, 0] + h * a[0, 1]
        ql, qs = params[0]
        # P_h00 of T^h P T^h' plus the noise added over h steps (closed form for a local linear trend).
        var00 = (p00[0] + 2 * h * p01[0] + h * h * p11[0] + h * ql + qs * (h - 1) * h * (2 * h - 1) / 6)
        return mean, np.sqrt(scale[0] * (var00 + 1.0))


FORECASTERS = {c.name: c for c in (ConstantForecaster, LastValueForecaster, HoltForecaster, KalmanForecaster)}


def make_forecaster(name: str, step_s: float = 5.0, window: int = 120, refit_s: float = 60.0) -> Forecaster:
    """A new forecaster by name: constant, reactive, holt or kalman."""
    if name not in FORECASTERS:
        raise ValueError(f"unknown forecaster {name!r}; choose from {', '.join(FORECASTERS)}")
    cls = FORECASTERS[name]
    if issubclass(cls, _FittedForecaster):
        return cls(step_s=step_s, window=window, refit_s=refit_s)
    return cls(step_s=step_s, window=window)
