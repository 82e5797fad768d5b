"""The real-stack autoscale run's bookkeeping (bench/autoscale/autoscale_real.py), on made-up observations."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.autoscale.autoscale_real import real_trace, summarise

ARGS = SimpleNamespace(slo=1.0, real_duration=10.0, real_low=2.0, real_high=10.0, real_warm=2.0, real_ramp=4.0)


def test_the_ramp_holds_then_rises_then_holds():
    rate_at = real_trace(ARGS).rate  # 2 req/s for 2 s, up to 10 over 4 s, then held
    assert rate_at(0.0) == rate_at(1.9) == 2
    assert rate_at(4.0) == pytest.approx(6.0)
    assert rate_at(6.0) == rate_at(60.0) == 10


def test_summarise_counts_misses_replica_seconds_and_reversals():
    sent = [(0.5, 0.2), (1.0, 1.5), (2.0, None), (3.0, 0.4)]  # one slow, one failed
    states = [(0.0, {"running": 1}), (2.0, {"running": 1, "starting": 1}), (4.0, {"running": 2}),
              (8.0, {"running": 1, "stopping": 1}), (9.0, {"running": 1}), (10.0, {"running": 1}),
              (11.0, {"running": 1})]  # after the run: dropped
    m = summarise("forecast", sent, states, ARGS)
    assert m["requests"] == 4 and m["failed"] == 1 and m["ttft_slo_misses"] == 2
    assert m["replica_seconds"] == pytest.approx(1 * 2 + 1 * 2 + 2 * 4 + 1 * 1 + 1 * 1)
    assert m["second_replica_asked_s"] == 2.0 and m["second_replica_running_s"] == 4.0
    assert m["direction_changes"] == {"decode": 1}  # up at 2 s, down at 8 s
    assert [p["decode_target"] for p in m["series"]] == [1, 2, 2, 1, 1, 1]
    assert [p["ttft_misses"] for p in m["series"]] == [1, 1, 0, 0, 0, 0]  # each until the next state
