"""The P:D extrapolation model on hand-made costs: exact fits, queues and splits."""

from __future__ import annotations

import math

import pytest

from bench.pd_model import (Costs, Line, Slo, Workload, best_splits, calibrate, decode_batch, erlang_c,
                              evaluate, fit_line, max_rate, mean_wait, wait_tail)

# 1500-token prompts cost 0.16 s of prefill; a decode step costs 10 ms + 0.2 ms per sequence.
COSTS = Costs(prefill_fixed_s=0.01, prefill_per_token_s=0.0001, decode_step_s=0.01, decode_per_seq_s=0.0002)
SLO = Slo(ttft_s=1.0, tpot_s=0.05)
PREFILL_HEAVY = Workload(rate=1, input_tokens=[1500], output_tokens=[16], name="prefill-heavy")
DECODE_HEAVY = Workload(rate=1, input_tokens=[64], output_tokens=[256], name="decode-heavy")


def test_fit_line_takes_the_median_of_repeats_then_least_squares():
    points = [(0, 1.0), (10, 2.0), (10, 2.0), (10, 50.0), (20, 3.0)]
    line = fit_line(points)
    assert line.intercept == pytest.approx(1.0)
    assert line.slope == pytest.approx(0.1)
    assert line(30) == pytest.approx(4.0)


def test_fit_line_on_one_x_is_flat_through_the_median():
    assert fit_line([(4, 1.0), (4, 3.0), (4, 2.0)]) == Line(2.0, 0.0)
    with pytest.raises(ValueError):
        fit_line([])


def test_calibrate_recovers_prefill_decode_and_kv_lines():
    lengths = (32, 512, 1024)
    coloc = [(n, 0.02 + 0.001 * n) for n in lengths for _ in range(3)]
    disagg = [(n, 0.02 + 0.001 * n + 0.005 + 0.0001 * n) for n in lengths]
    tpot = [(b, 0.01 + 0.002 * b) for b in (1, 4, 8)]
    c = calibrate(coloc, tpot, disagg, max_batch=64)
    # The 20 ms TTFT intercept: one engine step (the 10 ms decode step) keeps prefill busy, the rest is overhead.
    assert c.prefill_fixed_s == pytest.approx(0.01)
    assert c.overhead_s == pytest.approx(0.01)
    assert c.prefill_per_token_s == pytest.approx(0.001)
    assert c.decode_step_s == pytest.approx(0.01)
    assert c.decode_per_seq_s == pytest.approx(0.002)
    assert c.kv_fixed_s == pytest.approx(0.005)
    assert c.kv_per_token_s == pytest.approx(0.0001)
    assert c.max_batch == 64


def test_calibrate_clamps_noise_below_zero_and_needs_common_lengths():
    # TPOT that falls with batch size is noise: the slope becomes 0, not negative.
    c = calibrate([(10, 0.1), (20, 0.2)], [(1, 0.02), (8, 0.01)])
    assert c.decode_per_seq_s == 0.0
    assert (c.kv_fixed_s, c.kv_per_token_s) == (0.0, 0.0)
    with pytest.raises(ValueError, match="share no input length"):
        calibrate([(10, 0.1)], [(1, 0.02)], disagg_ttft=[(30, 0.3)])


def test_erlang_c_known_values():
    assert erlang_c(1, 0.5) == pytest.approx(0.5)
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(3, 0.0) == 0.0
    assert erlang_c(2, 2.0) == 1.0


def test_mean_wait_is_exact_for_md1_and_mm1():
    # Pollaczek-Khinchine: M/D/1 waits rho / (2 mu (1 - rho)), M/M/1 twice that.
    assert mean_wait(1, 0.5, 1.0, cv2=0.0) == pytest.approx(0.5)
    assert mean_wait(1, 0.5, 1.0, cv2=1.0) == pytest.approx(1.0)
    assert mean_wait(1, 1.0, 1.0, cv2=0.0) == math.inf


def test_wait_tail():
    assert wait_tail(1, 0.5, 1.0, 1.0, t=-0.1) == 1.0  # the SLO is gone before queueing
    assert wait_tail(1, 0.5, 1.0, 1.0, t=0.0) == pytest.approx(0.5)  # P(wait) = rho
    assert wait_tail(1, 0.5, 1.0, 1.0, t=2.0) == pytest.approx(0.5 * math.exp(-1.0))
    assert wait_tail(1, 2.0, 1.0, 1.0, t=5.0) == 1.0  # overloaded


def test_decode_batch_is_littles_law_fixed_point():
    c = Costs(prefill_fixed_s=0.01, prefill_per_token_s=0.0, decode_step_s=0.01, decode_per_seq_s=0.001)
    assert decode_batch(1.0, 10, c) == pytest.approx(0.1 / 0.99)
    assert decode_batch(1.0, 1000, c) == math.inf  # 1000 tokens/s > 1/0.001 per second
    assert decode_batch(1.0, 600, Costs(**{**c.__dict__, "max_batch": 4})) == math.inf  # batch 15 > 4


def test_evaluate_overloaded_prefill_has_no_goodput():
    e = evaluate(1, 1, PREFILL_HEAVY.at(7), COSTS, SLO)  # 7/s * 0.16 s = 1.12 > 1 engine
    assert e.prefill_util == pytest.approx(1.12)
    assert (e.ttft_mean_s, e.attainment, e.goodput_rps) == (math.inf, 0.0, 0.0)


def test_evaluate_at_low_load_meets_slo():
    e = evaluate(1, 1, PREFILL_HEAVY.at(0.01), COSTS, SLO)
    assert e.attainment == pytest.approx(1.0, abs=1e-3)
    assert e.ttft_mean_s == pytest.approx(0.16, abs=1e-3)
    assert e.tpot_s == pytest.approx(0.01, abs=1e-4)


def test_overhead_adds_to_ttft_without_occupying_prefill():
    slow = Costs(**{**COSTS.__dict__, "overhead_s": 0.5})
    base, late = (evaluate(1, 1, PREFILL_HEAVY.at(2), c, SLO) for c in (COSTS, slow))
    assert late.ttft_mean_s == pytest.approx(base.ttft_mean_s + 0.5)
    assert late.prefill_util == base.prefill_util == pytest.approx(0.32)
    assert late.attainment < base.attainment


def test_more_prefill_engines_win_for_prefill_heavy():
    ranked = best_splits(8, PREFILL_HEAVY, COSTS, SLO)
    assert [(e.prefill, e.decode) for e in ranked[:3]] == [(7, 1), (6, 2), (5, 3)]
    assert ranked[0].attainment == pytest.approx(0.9)
    assert ranked[0].rate == pytest.approx(42.435, abs=1e-3)


def test_more_decode_engines_win_for_decode_heavy():
    ranked = best_splits(8, DECODE_HEAVY, COSTS, SLO)
    best = ranked[0]
    assert (best.prefill, best.decode) == (2, 6)
    # Decode-bound: TPOT reaches its SLO at batch 200, i.e. 200 / (256 * 0.05) = 15.625 req/s per engine.
    assert best.rate == pytest.approx(6 * 15.625, rel=1e-6)
    assert best.goodput_per_gpu == pytest.approx(6 * 15.625 / 8, rel=1e-6)
    assert best.decode_batch == pytest.approx(200.0, rel=1e-6)


def test_prefix_hits_raise_the_prefill_bound_rate():
    cold = max_rate(1, 1, PREFILL_HEAVY, COSTS, SLO).rate
    warm = max_rate(1, 1, Workload(1, [1500], [16], prefix_hit=0.5), COSTS, SLO).rate
    assert warm > 1.5 * cold


def test_max_rate_is_zero_when_an_idle_cluster_misses_the_slo():
    e = max_rate(1, 1, PREFILL_HEAVY, COSTS, Slo(ttft_s=0.1, tpot_s=0.05))
    assert (e.rate, e.goodput_rps) == (0.0, 0.0)


def test_scaled_costs_divide_each_part_by_its_factor():
    s = COSTS.scaled(compute=10, memory=4, network=2, fixed=5)
    assert s.prefill_per_token_s == pytest.approx(0.00001)
    assert (s.decode_step_s, s.decode_per_seq_s) == (pytest.approx(0.0025), pytest.approx(0.00005))
    assert s.prefill_fixed_s == pytest.approx(0.0025)  # an engine step
    assert COSTS.scaled(1, fixed=5).overhead_s == 0.0
    assert COSTS.scaled(10).decode_step_s == pytest.approx(0.001)  # memory defaults to compute
    with pytest.raises(ValueError):
        COSTS.scaled(0)


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError):
        Workload(rate=1, input_tokens=[], output_tokens=[1])
    with pytest.raises(ValueError):
        Workload(rate=1, input_tokens=[1], output_tokens=[1], prefix_hit=1.0)
    with pytest.raises(ValueError):
        Costs(prefill_fixed_s=-1, prefill_per_token_s=0, decode_step_s=0.1, decode_per_seq_s=0)
    with pytest.raises(ValueError):
        evaluate(0, 2, PREFILL_HEAVY, COSTS, SLO)
