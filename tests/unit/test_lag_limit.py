"""The permits a front's event-loop lag allows (deployments/admission/lag_limit.py): pure, time passed in."""

from __future__ import annotations

import pytest

from common.config import AdmissionConfig
from deployments.admission.lag_limit import LagLimit, from_config


def window(limit: LagLimit, now: float, lag_s: float, in_use: int, ceiling: int = 256, samples: int = 25) -> int:
    """One half-second window of `samples` lags of `lag_s`, then the step that judges it."""
    for _ in range(samples):
        limit.observe(lag_s)
    return limit.step(now, in_use, ceiling)


def test_no_limit_while_the_loop_keeps_up():
    lim = LagLimit(floor=32)  # bounds 15 ms and 7.5 ms
    assert lim.step(0.0, 0, 256) == 256
    for i in range(1, 20):
        assert window(lim, i * 0.5, 0.003, in_use=256) == 256  # busy, but the loop is on time
        assert window(lim, i * 0.5 + 0.25, 0.012, in_use=256) == 256  # between the bounds: no change
    assert lim.limit == float("inf")


def test_a_lagging_loop_cuts_what_is_in_flight_by_how_far_over_the_bound_it_is():
    lim = LagLimit(floor=32)
    lim.step(0.0, 0, 256)
    assert window(lim, 0.5, 0.020, in_use=200) == 150  # 15/20 of the 200 in flight, not of the 256 leased
    lim.observe(0.016)
    assert lim.step(0.7, 150, 256) == 150  # half a second has not passed: the window goes on
    assert window(lim, 1.0, 0.016, in_use=150) == 135  # just over: a tenth
    assert window(lim, 1.5, 0.100, in_use=135) == 68  # far over: half
    for i in range(4, 12):
        window(lim, i * 0.5, 0.100, in_use=150)
    assert lim.step(6.0, 150, 256) == 32  # never below the floor


def test_the_limit_grows_back_when_the_lag_falls_and_lets_go_at_the_lease():
    lim = LagLimit(floor=32)
    lim.step(0.0, 0, 256)
    assert window(lim, 0.5, 0.050, in_use=96) == 48
    assert window(lim, 1.0, 0.010, in_use=48) == 48  # in the band: held
    assert window(lim, 1.5, 0.001, in_use=48) == 57  # +20%
    grown = [window(lim, 2.0 + i * 0.5, 0.001, in_use=10) for i in range(12)]
    assert grown == sorted(grown) and grown[-1] == 256
    assert lim.limit == float("inf")  # no longer limited: it follows the lease up and down
    assert lim.step(9.0, 10, 300) == 300


def test_the_lease_caps_the_limit_and_a_window_needs_samples():
    lim = LagLimit(floor=32)
    lim.step(0.0, 0, 256)
    assert window(lim, 0.5, 0.030, in_use=150) == 75
    assert lim.step(5.0, 100, 40) == 40  # a smaller lease wins
    assert lim.step(10.0, 100, 256) == 75  # no samples since: no judgement
    assert window(lim, 10.5, 0.030, in_use=100, samples=2) == 75  # too few: the window goes on
    assert window(lim, 10.6, 0.030, in_use=100, samples=1) == 38  # half the limit: fewer than in use
    assert window(lim, 11.5, 0.030, in_use=40, ceiling=16) == 16  # the floor is never above the lease


def test_lag_with_no_more_than_the_floor_in_flight_cuts_nothing():
    lim = LagLimit(floor=32)
    lim.step(0.0, 0, 256)
    assert window(lim, 0.5, 0.200, in_use=0) == 256  # an engine warming up held the loop, not requests
    assert window(lim, 1.0, 0.200, in_use=32) == 256 and lim.limit == float("inf")
    assert window(lim, 1.5, 0.200, in_use=33) == 32


def test_from_config_spares_cpu_engines_and_can_be_switched_off():
    assert from_config(AdmissionConfig(max_loop_lag_s=None)) is None
    cpu = from_config(AdmissionConfig())  # 16 permits: the floor is the whole of them
    assert cpu.floor == 16 and cpu.high_s == 0.015 and cpu.low_s == pytest.approx(0.0075)
    gpu = from_config(AdmissionConfig(capacity_per_replica=1024, max_loop_lag_s=0.02))
    assert gpu.floor == 128 and gpu.high_s == 0.02 and gpu.low_s == pytest.approx(0.01)


@pytest.mark.parametrize("kw", [{"floor": 0}, {"floor": 4, "high_s": 0.01, "low_s": 0.01},
                                {"floor": 4, "interval_s": 0}, {"floor": 4, "grow": 0}])
def test_bad_settings_are_refused(kw):
    with pytest.raises(ValueError):
        LagLimit(**kw)
