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
* `HoltForecaster`: Holt's damped-trend exponential smoothing, ETS(A,Ad,N)
  (statsmodels `ETSModel`).
* `KalmanForecaster`: a local linear trend state-space model, a Kalman filter
  (statsmodels `UnobservedComponents`).

Both are fit by maximum likelihood every `refit_s`; in between, each new bin
re-runs the model with the fitted parameters. Both give the standard error of
the forecast *level*, so `predict(h, z)` can return an upper quantile of the
rate itself: the model's observation noise (one bin's scatter about the level,
Poisson noise at low rates) is left out, since capacity is planned for the
rate over many bins, not for one bin's count. On 2 s bins of a 1.4 req/s load
that noise is most of a one-bin forecast's error (about 0.87 of 0.9 req/s).
Model work happens when a bin closes: one fit per `refit_s`, one pass and one
forecast path (up to `max_horizon_s`) per bin, whatever the caller's sample
rate; `predict` reads the stored path. statsmodels brings scipy into the environment, which vLLM's engine
imports load whenever it is installed; `bench serve` was measured with it
(docs/benchmarks.md).
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
    """Refits every `refit_s`, re-applies the fitted parameters on every new bin.

    The models are statsmodels': a fit is its maximum likelihood (warm-started
    from the previous fit), an apply keeps the fitted parameters and re-runs the
    model's filter over the window. Measured on 120 bins: a fit 10-50 ms, an
    apply and its forecast path a few ms.
    """

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
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            import statsmodels.tools.sm_exceptions  # noqa: F401 - its import adds "always" filters
            warnings.simplefilter("ignore")  # convergence chatter on flat or short windows
            try:
                if self._res is None or t - self._fitted_at >= self.refit_s:
                    res = self._fit(y)
                    self._fitted_at = t
                else:
                    res = self._apply(y)
                mean, se = self._path(res, self.steps)
            except (ValueError, np.linalg.LinAlgError):  # a degenerate window: keep the last model
                return
        if np.all(np.isfinite(mean)) and np.all(np.isfinite(se)):
            self._res, self._mean, self._se = res, mean, se

    def _fit(self, y: np.ndarray):
        """A new fit to `y`: the results object. Changes nothing on self."""
        raise NotImplementedError

    def _apply(self, y: np.ndarray):
        """The latest fit's parameters run over `y`: the results object."""
        raise NotImplementedError

    @staticmethod
    def _path(res, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Forecast mean and the standard error of the forecast level, 1..`steps` bins after the window."""
        raise NotImplementedError

    def predict(self, horizon_s: float, z: float = 0.0) -> float:
        """As `Forecaster.predict`, but a trend is carried no further ahead than the history it was
        fitted on: a local linear trend fitted on 48 s of flat load and carried 63 s ahead has a
        level error wide enough that its upper quantile asked for three replicas at half of one's
        planned rate (bench autoscale --real)."""
        if self._mean is None:
            return max(0.0, self.recent())
        i = min(self.steps, len(self.bins), max(1, int(math.ceil(horizon_s / self.step_s)))) - 1
        value = float(self._mean[i] + z * self._se[i])
        return max(0.0, value) if math.isfinite(value) else max(0.0, self.recent())


class HoltForecaster(_FittedForecaster):
    """Holt's damped additive trend as the state-space model ETS(A,Ad,N)
    (statsmodels `ETSModel`), fit by maximum likelihood. An apply keeps the
    smoothing and damping parameters and re-estimates only the initial level and
    trend of the moved window. The standard error is ETSModel's analytic
    prediction variance less its one-step error variance (the model's `mse`)."""

    name = "holt"
    SMOOTHING = ("smoothing_level", "smoothing_trend", "damping_trend")

    @staticmethod
    def _model(y: np.ndarray):
        import pandas as pd
        from statsmodels.tsa.exponential_smoothing.ets import ETSModel

        # A Series, not an array: ETSModel's prediction needs an index (statsmodels 0.15).
        return ETSModel(pd.Series(y), error="add", trend="add", damped_trend=True)

    def _fit(self, y: np.ndarray):
        model = self._model(y)
        start = None if self._res is None else np.asarray(self._res.params)
        return model.fit(start_params=start, disp=False)

    def _apply(self, y: np.ndarray):
        model = self._model(y)
        fixed = {name: float(self._res.params.iloc[i]) for i, name in enumerate(self._res.param_names)
                 if name in self.SMOOTHING}
        with model.fix_params(fixed):
            return model.fit(disp=False)

    @staticmethod
    def _path(res, steps: int) -> tuple[np.ndarray, np.ndarray]:
        n = res.nobs
        pred = res.get_prediction(start=n, end=n + steps - 1)
        var = np.asarray(pred.var_pred_mean, dtype=float) - float(res.mse)  # less the one-step error's
        return np.asarray(pred.predicted_mean, dtype=float), np.sqrt(np.maximum(var, 0.0))


class KalmanForecaster(_FittedForecaster):
    """A local linear trend by Kalman filter (statsmodels `UnobservedComponents`),
    its variances fit by maximum likelihood; an apply re-filters the moved window
    with them. The standard error is the predicted observation's less the irregular
    (observation) variance: the level's and trend's."""

    name = "kalman"

    def _fit(self, y: np.ndarray):
        from statsmodels.tsa.statespace.structural import UnobservedComponents

        start = None if self._res is None else self._res.params  # warm start: a few iterations
        return UnobservedComponents(y, level=TREND).fit(start_params=start, disp=False)

    def _apply(self, y: np.ndarray):
        return self._res.apply(y)

    @staticmethod
    def _path(res, steps: int) -> tuple[np.ndarray, np.ndarray]:
        fc = res.get_forecast(steps)
        irregular = float(np.asarray(res.params)[res.model.param_names.index("sigma2.irregular")])
        var = np.asarray(fc.se_mean, dtype=float) ** 2 - irregular
        return np.asarray(fc.predicted_mean, dtype=float), np.sqrt(np.maximum(var, 0.0))


FORECASTERS = {c.name: c for c in (ConstantForecaster, LastValueForecaster, HoltForecaster, KalmanForecaster)}


def make_forecaster(name: str, step_s: float = 5.0, window: int = 120, refit_s: float = 60.0) -> Forecaster:
    """A new forecaster by name: constant, reactive, holt or kalman."""
    if name not in FORECASTERS:
        raise ValueError(f"unknown forecaster {name!r}; choose from {', '.join(FORECASTERS)}")
    cls = FORECASTERS[name]
    if issubclass(cls, _FittedForecaster):
        return cls(step_s=step_s, window=window, refit_s=refit_s)
    return cls(step_s=step_s, window=window)
