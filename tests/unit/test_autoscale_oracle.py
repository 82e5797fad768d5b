"""The clairvoyant floor under replica-seconds (bench/autoscale/autoscale_oracle.py), on hand-computed traces."""

from __future__ import annotations

import pytest

from bench.autoscale.autoscale_oracle import for_real_run, replica_seconds, replicas_needed
from bench.autoscale.autoscale_traces import Trace


def test_replicas_needed_rounds_up_within_the_bounds():
    assert replicas_needed(0.0, 4.0, 1, 3) == 1  # min_replicas even with no load
    assert replicas_needed(4.0, 4.0, 1, 3) == 1  # exactly full
    assert replicas_needed(4.01, 4.0, 1, 3) == 2
    assert replicas_needed(100.0, 4.0, 1, 3) == 3  # max_replicas caps it
    with pytest.raises(ValueError):
        replicas_needed(1.0, 0.0, 1, 3)


def test_replica_seconds_follow_the_rate_with_no_start_time():
    step = Trace("step", 20.0, lambda t: 2.0 if t < 10 else 7.0)  # 1 replica, then 2 at 4 req/s each
    assert replica_seconds(step, 4.0, 20.0, 1, 3) == pytest.approx(10 * 1 + 10 * 2)
    rise = Trace("rise", 10.0, lambda t: t)  # 0 to 10 req/s: 2 from 4 s, 3 from 8 s
    assert replica_seconds(rise, 4.0, 10.0, 1, 3, dt=0.01) == pytest.approx(4 * 1 + 4 * 2 + 2 * 3, abs=0.05)


def test_a_real_run_gets_the_floor_at_the_planned_and_the_peak_rate():
    curve = {"unit": "prompt_tokens", "tokens_per_request": 100,
             "points": [{"batch": 1, "tokens_per_s": 200.0}, {"batch": 4, "tokens_per_s": 500.0}]}
    run = {"duration_s": 20.0, "low_rps": 2.0, "high_rps": 8.0, "warm_s": 10.0, "ramp_s": 1e-9,
           "policies": {"forecast": {"replica_seconds": 45.0}, "reactive": {"replica_seconds": 30.0}}}
    result = {"config": {"max_replicas": 3, "calibration": {"curve": curve, "planned_rps_per_replica": 4.0}},
              "traces": {"ramp_real": run}}
    out = for_real_run(result)  # 2 req/s for 10 s, then 8: planned 1 then 2; at the peak (5 req/s) 1 then 2
    assert out["planned"]["replica_seconds"] == pytest.approx(30.0)
    assert out["peak_measured"]["per_replica_rps"] == 5.0
    assert out["peak_measured"]["replica_seconds"] == pytest.approx(30.0)
    assert out["planned"]["policies_against_it"] == {"forecast": 1.5, "reactive": 1.0}
    assert out["planned"]["against_reactive"] == 0.0
    result["config"]["calibration"] = {}
    with pytest.raises(ValueError, match="calibration"):
        for_real_run(result)
