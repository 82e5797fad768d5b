"""Forecasters of deployments/autoscaling/forecast.py: binning, baselines, the fitted models."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from deployments.autoscaling.forecast import (FORECASTERS, ConstantForecaster, HoltForecaster, KalmanForecaster,
                                  LastValueForecaster, make_forecaster)


def test_samples_are_averaged_into_bins_and_gaps_repeat_the_last():
    f = ConstantForecaster(step_s=5.0, span=1)
    f.observe(0.0, 2.0)
    f.observe(4.0, 4.0)
    assert list(f.bins) == []  # the first bin is still open
    f.observe(5.0, 10.0)
    assert list(f.bins) == [3.0]
    f.observe(21.0, 1.0)  # bins 5-10, 10-15, 15-20 close; the empty ones repeat 10
    assert list(f.bins) == [3.0, 10.0, 10.0, 10.0]
    assert f.predict(60) == 10.0 and f.last == 1.0


def test_constant_and_last_value_are_flat():
    c, r = ConstantForecaster(span=2), LastValueForecaster()
    for i, v in enumerate([1.0, 2.0, 3.0, 7.0]):
        c.observe(i * 5.0, v)
        r.observe(i * 5.0, v)
    assert c.predict(10) == c.predict(300) == pytest.approx(2.5)  # bins 2 and 3
    assert r.predict(10) == r.predict(300) == 7.0


@pytest.mark.parametrize("cls", [HoltForecaster, KalmanForecaster])
def test_trend_models_extrapolate_a_ramp(cls):
    rng = np.random.default_rng(0)
    f = cls(step_s=5.0, window=60, refit_s=60.0)
    slope = 0.05  # per second
    for k in range(80):
        f.observe(k * 5.0, 10.0 + slope * k * 5.0 + rng.normal(0, 0.3))
    now = 10.0 + slope * 78 * 5.0  # the last closed bin; forecasts start there
    ahead = f.predict(60.0)
    assert ahead > now + 1.0  # the rise continues (truth: +3)
    assert abs(ahead - (now + slope * 60)) < 2.0
    assert f.predict(60.0, z=1.0) >= ahead


def test_kalman_gives_an_upper_quantile_and_never_negative():
    f = KalmanForecaster(step_s=5.0, window=60)
    for k in range(60):
        f.observe(k * 5.0, max(0.0, 5.0 - 0.2 * k))  # falls to zero and stays
    assert f.predict(120.0) >= 0.0
    assert f.predict(30.0, z=2.0) >= f.predict(30.0)


def test_models_fall_back_to_the_recent_mean_before_enough_bins():
    f = KalmanForecaster()
    for k in range(5):
        f.observe(k * 5.0, 4.0)
    assert f.predict(60.0) == pytest.approx(4.0)


def test_a_trend_is_carried_no_further_than_the_history_it_was_fitted_on():
    rng = np.random.default_rng(1)
    f = KalmanForecaster(step_s=2.0, window=60, refit_s=20.0)
    for k in range(25):  # 24 closed bins (48 s): the first fit
        f.observe(k * 2.0, 10.0 + 0.5 * k * 2.0 + rng.normal(0, 0.2))
    assert len(f.bins) == 24
    assert f.predict(63.0) == f.predict(48.0) == f.predict(300.0)  # 24 bins ahead at most
    assert f.predict(63.0) > f.predict(20.0)  # the rising trend is still carried, as far as 48 s
    for k in range(25, 40):
        f.observe(k * 2.0, 10.0 + 0.5 * k * 2.0)
    assert f.predict(63.0) > f.predict(48.0)  # 39 bins seen: 63 s ahead is 32 bins


def test_fitting_is_quiet():
    f = HoltForecaster(step_s=1.0, window=40, refit_s=5.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a convergence warning would fail the test
        for k in range(60):
            f.observe(float(k), 3.0)  # flat: the hardest case for the optimisers
    assert f.predict(10.0) == pytest.approx(3.0, abs=0.01)


def test_make_forecaster_by_name():
    assert set(FORECASTERS) == {"constant", "reactive", "holt", "kalman"}
    assert isinstance(make_forecaster("kalman", step_s=2.0), KalmanForecaster)
    assert make_forecaster("constant").step_s == 5.0
    with pytest.raises(ValueError):
        make_forecaster("prophet")
