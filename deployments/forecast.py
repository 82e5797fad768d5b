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
* `HoltForecaster`: Holt's damped-trend exponential smoothing
  (statsmodels `ExponentialSmoothing`). Its parameters are fit by maximum
  likelihood every `refit_s`; in between each new bin re-runs the smoother with
  those parameters (a few ms).
* `KalmanForecaster`: a local linear trend state-space model
  (statsmodels `UnobservedComponents`, a Kalman filter). Fit every `refit_s`,
  re-filtered with the fitted variances on each new bin. It also gives the
  forecast's standard error, so `predict(h, z)` can return an upper quantile.

All statsmodels work happens when a bin closes: one small fit per `refit_s`, one
filter pass and one forecast path (up to `max_horizon_s`) per bin, whatever the
caller's sample rate; `predict` reads the stored path.
Pure logic: no clock, no Ray.
"""

from __future__ import annotations

import math
import warnings
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
    """Refits every `refit_s`, re-applies the fitted parameters on every new bin."""

    def __init__(self, step_s: float = 5.0, window: int = 120, refit_s: float = 60.0,
                 max_horizon_s: float = 300.0) -> None:
        super().__init__(step_s, window)
        self.refit_s = refit_s
        self.steps = max(1, int(math.ceil(max_horizon_s / step_s)))
        self._fitted_at: float | None = None
        self._res = None  # the statsmodels results of the latest pass
        self._mean: np.ndarray | None = None  # forecast path, 1..steps bins ahead
        self._se: np.ndarray | None = None

    def _closed(self, t: float) -> None:
        if len(self.bins) < MIN_FIT_BINS:
            return
        y = np.asarray(self.bins, dtype=float)
        with warnings.catch_warnings():
            import statsmodels.tools.sm_exceptions  # noqa: F401 - its import adds "always" filters
            warnings.simplefilter("ignore")  # convergence chatter on flat or short series
            try:
                if self._fitted_at is None or t - self._fitted_at >= self.refit_s:
                    self._res = self._fit(y)
                    self._fitted_at = t
                else:
                    self._res = self._apply(y)
                self._mean, self._se = self._path(self.steps)
            except (ValueError, np.linalg.LinAlgError):  # a degenerate window: keep the last model
                pass

    def _fit(self, y: np.ndarray):
        raise NotImplementedError

    def _apply(self, y: np.ndarray):
        raise NotImplementedError

    def _path(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Forecast mean and standard error 1..`steps` bins ahead."""
        raise NotImplementedError

    def predict(self, horizon_s: float, z: float = 0.0) -> float:
        if self._mean is None:
            return max(0.0, self.recent())
        i = min(self.steps, max(1, int(math.ceil(horizon_s / self.step_s)))) - 1
        value = float(self._mean[i] + z * self._se[i])
        return max(0.0, value) if math.isfinite(value) else max(0.0, self.recent())


class HoltForecaster(_FittedForecaster):
    """Holt's damped additive trend (statsmodels.tsa.holtwinters.ExponentialSmoothing)."""

    name = "holt"

    def _fit(self, y: np.ndarray):
        from statsmodels.tsa.holtwinters import ExponentialSmoothing

        res = ExponentialSmoothing(y, trend="add", damped_trend=True,
                                   initialization_method="estimated").fit()
        self._params = {k: float(res.params[k]) for k in ("smoothing_level", "smoothing_trend", "damping_trend")}
        self._sigma = float(np.std(res.resid)) if len(res.resid) else 0.0
        return res

    def _apply(self, y: np.ndarray):
        from statsmodels.tsa.holtwinters import ExponentialSmoothing

        return ExponentialSmoothing(y, trend="add", damped_trend=True,
                                    initialization_method="heuristic").fit(optimized=False, **self._params)

    def _path(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        mean = np.asarray(self._res.forecast(steps), dtype=float)
        return mean, self._sigma * np.sqrt(np.arange(1, steps + 1))


class KalmanForecaster(_FittedForecaster):
    """Local linear trend by Kalman filter (statsmodels UnobservedComponents)."""

    name = "kalman"

    def _fit(self, y: np.ndarray):
        from statsmodels.tsa.statespace.structural import UnobservedComponents

        start = None if self._res is None else self._res.params  # warm start: a few iterations
        return UnobservedComponents(y, level=TREND).fit(start_params=start, disp=False)

    def _apply(self, y: np.ndarray):
        return self._res.apply(y)

    def _path(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        fc = self._res.get_forecast(steps)
        return np.asarray(fc.predicted_mean, dtype=float), np.asarray(fc.se_mean, dtype=float)


FORECASTERS = {c.name: c for c in (ConstantForecaster, LastValueForecaster, HoltForecaster, KalmanForecaster)}


def make_forecaster(name: str, step_s: float = 5.0, window: int = 120, refit_s: float = 60.0) -> Forecaster:
    """A new forecaster by name: constant, reactive, holt or kalman."""
    if name not in FORECASTERS:
        raise ValueError(f"unknown forecaster {name!r}; choose from {', '.join(FORECASTERS)}")
    cls = FORECASTERS[name]
    if issubclass(cls, _FittedForecaster):
        return cls(step_s=step_s, window=window, refit_s=refit_s)
    return cls(step_s=step_s, window=window)
