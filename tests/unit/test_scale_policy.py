"""Capacity curves, the forecast scale policy and its guard rails, and the Serve glue
(deployments/autoscaling/capacity.py, scale_policy.py, autoscaling.py) against Ray 2.60's own wrappers."""

from __future__ import annotations

import json
import logging

import pytest

from common.config.autoscale import ForecastAutoscaling
from common.constants import REPO_ROOT
from deployments.autoscaling import autoscaling as glue
from deployments.autoscaling import capacity
from deployments.autoscaling.capacity import CapacityFile, CurvePoint, PoolCurve, replicas_for
from deployments.autoscaling.forecast import ConstantForecaster
from deployments.autoscaling.scale_policy import (AppPolicy, ForecastPolicy, GuardRails, PolicyParams, RateMeter,
                                      ReactivePolicy, Signals, deferred_rate)

CURVE = PoolCurve(points=[CurvePoint(batch=1, tokens_per_s=100.0), CurvePoint(batch=8, tokens_per_s=450.0)])


# -- capacity curves --------------------------------------------------------------------------

def test_curve_interpolates_and_stays_flat_beyond_the_largest_batch():
    assert CURVE.tokens_per_s(1) == 100.0
    assert CURVE.tokens_per_s(4.5) == pytest.approx(275.0)
    assert CURVE.tokens_per_s(16) == 450.0
    assert CURVE.tokens_per_s(0.5) == 50.0 and PoolCurve().tokens_per_s(4) == 0.0
    assert CURVE.service_s(8, 100) == pytest.approx(100 * 8 / 450)
    assert CURVE.target_batch(100, 1.0) == 1 and CURVE.target_batch(100, 10.0) == 8
    assert CURVE.target_batch(100, 1.5) == 3  # 300 / 200 = 1.5 s fits, 400 / 250 = 1.6 s does not


def test_a_curve_with_measured_ttfts_sizes_the_batch_by_them():
    pts = [{"batch": 1, "tokens_per_s": 100.0, "ttft_s": 0.2}, {"batch": 4, "tokens_per_s": 300.0, "ttft_s": 0.5},
           {"batch": 8, "tokens_per_s": 450.0, "ttft_s": 1.1}]
    curve = PoolCurve(tokens_per_request=100, points=pts)
    assert curve.ttft_measured() and not CURVE.ttft_measured()
    # By service a request of 100 tokens fits 1.5 s only up to batch 3; by the TTFTs measured, batch 4.
    assert curve.target_batch(100, 1.0) == 4 and curve.target_batch(100, 1.2) == 8
    assert curve.target_batch(200, 1.2) == 4  # twice the tokens: twice the measured TTFT
    assert curve.target_batch(100, 0.1) == 1  # none fits: at least one
    partial = PoolCurve(tokens_per_request=100, points=[*pts[:2], {"batch": 8, "tokens_per_s": 450.0}])
    # One point without a TTFT: sized by service, 2 x 100 tokens at 166.7 tokens/s = 1.2 s, 3 x 100 at 233.3 = 1.29 s.
    assert not partial.ttft_measured() and partial.target_batch(100, 1.25) == 2


def test_replicas_for():
    assert replicas_for(0, 100) == 0 and replicas_for(250, 100) == 3 and replicas_for(300, 100) == 3
    with pytest.raises(ValueError):
        replicas_for(1, 0)


def test_curve_file_schema_loader_and_place_beside_the_config(tmp_path):
    cfg = tmp_path / "prod.yaml"
    assert capacity.beside(cfg) == tmp_path / "prod.capacity.yaml"
    assert capacity.load_for_config(cfg).model.startswith("baton-tiny")  # none beside it: the default
    (tmp_path / "prod.capacity.yaml").write_text(
        "version: 1\npools:\n  decode: {unit: output_tokens, points: [{batch: 2, tokens_per_s: 50}]}\n")
    got = capacity.load_for_config(cfg)
    assert got.curve("decode").tokens_per_s(2) == 50.0 and got.curve("prefill").empty()
    for bad in ("pools: {prefil: {points: []}}\n", "pools: {decode: {points: [{batch: 0, tokens_per_s: 1}]}}\n",
                "pools: {decode: {points: [{batch: 1, tokens_per_s: 1}, {batch: 1, tokens_per_s: 2}]}}\n",
                "bogus: 1\n"):
        path = tmp_path / "bad.yaml"
        path.write_text(bad)
        with pytest.raises(ValueError, match="bad.yaml"):
            capacity.load(path)


def test_the_shipped_curve_is_the_measured_figures():
    """prefill and decode: derived from bench serve's runs; colocated: calibrated per batch size."""
    curves = capacity.load(capacity.DEFAULT_CURVE)
    runs = json.loads((REPO_ROOT / "docs" / "results" / "serve" / "threads.json").read_text())["rounds"]

    def mean(system, load, key):
        return sum(r["results"][system][load][key] for r in runs) / len(runs)

    for batch, load in ((1, "c1"), (8, "c8")):
        assert curves.curve("prefill").tokens_per_s(batch) == pytest.approx(
            400 * mean("baton_disaggregated", load, "request_throughput"), abs=0.01)
        assert curves.curve("decode").tokens_per_s(batch) == pytest.approx(
            mean("baton_disaggregated", load, "output_throughput"), abs=0.01)
    colocated = curves.curve("colocated")
    assert [p.batch for p in colocated.points] == [1, 2, 4, 8]  # bench/autoscale/capacity_curve.py's batch sizes
    assert all(a.tokens_per_s < b.tokens_per_s for a, b in zip(colocated.points, colocated.points[1:]))


# -- guard rails ------------------------------------------------------------------------------

def test_guard_rails_bound_delay_and_limit_reversals():
    g = GuardRails(1, 6, downscale_delay_s=60, cooldown_s=600)
    assert g.apply(0, 2, 9) == 6  # up at once, bounded
    assert g.apply(10, 6, 3) == 6  # below, but not yet for the delay
    assert g.apply(40, 6, 4) == 6
    assert g.apply(70, 6, 2) == 4  # after 60 s: the largest need seen meanwhile
    assert g.reversed_at == 70  # up then down: one direction change
    assert g.apply(100, 4, 5) == 4  # up again within the cool-down: held
    assert g.apply(110, 4, 5, urgent=True) == 5  # unless short by the mean forecast
    assert g.reversed_at == 110
    assert g.apply(300, 5, 0) == 5  # the scale-down delay starts
    assert g.apply(400, 5, 2) == 5  # delay passed, but a down would reverse within the cool-down
    assert g.apply(710, 5, 2) == 2  # 600 s after the last reversal


def test_rate_meter_differences_counters_per_replica():
    m = RateMeter()
    assert m.rate({"a": (100.0, 50.0)}) is None
    assert m.rate({"a": (100.0, 60.0)}) is None  # not newer
    assert m.rate({"a": (110.0, 150.0), "b": (109.0, 7.0)}) == pytest.approx(10.0)  # b is new: not counted
    assert m.rate({"b": (120.0, 27.0)}) == pytest.approx(2.0)  # a left; b's 20 over 10 s


# -- the policy -------------------------------------------------------------------------------

def _params(**kw) -> PolicyParams:
    base = dict(min_replicas=1, max_replicas=20, engine_start_s=60, downscale_delay_s=60, cooldown_s=300,
                step_s=5, refit_s=60, window=60, slo_ttft_s=10.0, prompt_tokens=100, utilization=1.0)
    return PolicyParams(**{**base, **kw})


def _ramp(policy, seconds, rate, n=1, t0=0.0):
    """Feeds `policy` a rate rate(t) through an arrivals counter; returns the counts it chose."""
    count, out = 0.0, []
    for k in range(int(seconds)):
        t = t0 + k
        count += rate(t)
        s = Signals(t=t, ongoing=rate(t), arrivals={"r": (t, count)}, prompt_tokens=100.0, prefix_hit=0.0)
        n = policy.decide(s, n)
        out.append(n)
    return out


def test_the_forecast_scales_ahead_of_a_ramp_and_the_constant_does_not():
    rate = lambda t: 2.0 if t < 300 else 2.0 + 0.05 * (t - 300)  # noqa: E731 - +3 req/s a minute
    kalman = ForecastPolicy("prefill", CURVE, _params(forecaster="kalman"))
    flat = ForecastPolicy("prefill", CURVE, _params(forecaster="constant"))
    a, b = _ramp(kalman, 500, rate), _ramp(flat, 500, rate)
    # 450 tokens/s a replica (batch 8 fits the 5 s budget): at 12 req/s, 1200 tokens/s need 3.
    assert max(a) >= max(b) + 1
    assert a.index(3) < b.index(3) if 3 in b else 3 in a


def test_without_a_curve_the_in_flight_count_is_forecast():
    p = ForecastPolicy("decode", PoolCurve(), _params(target_ongoing_requests=4, forecaster="constant"))
    for k in range(30):
        n = p.decide(Signals(t=float(k), ongoing=17.0), 2)
    assert n == 5 and p.last.urgent


def test_deferred_work_and_spare_capacity():
    assert deferred_rate(Signals(t=0, deferrable_tokens=0), 60) == 0.0
    assert deferred_rate(Signals(t=0, deferrable_tokens=6000, deferrable_due_s=660), 60) == pytest.approx(10.0)
    p = ForecastPolicy("prefill", CURVE, _params(forecaster="constant"))
    s = Signals(t=0, arrival_rps=2.0, prompt_tokens=100.0, running=2)
    p.observe(s)
    assert p.spare_tokens_per_s(s, 2) == pytest.approx(2 * 450 - 200)
    held = Signals(t=1, arrival_rps=2.0, prompt_tokens=100.0, running=4, deferrable_tokens=1e6,
                   deferrable_due_s=1e5)
    assert p.need(held, 4).hold >= 4  # batch work waiting keeps the replicas it can fill


def test_app_policy_shares_one_forecast_and_pools_move_together():
    pools = {"prefill": ForecastPolicy("prefill", CURVE, _params(forecaster="constant")),
             "decode": ForecastPolicy("decode", CURVE, _params(forecaster="constant", output_tokens=10))}
    app = AppPolicy(pools)
    assert pools["prefill"].forecaster is pools["decode"].forecaster
    current = {"prefill": 4, "decode": 1}
    for k in range(120):  # 9 req/s: prefill needs 2 (900 / 450), decode 1
        count = 9.0 * k
        sig = {"decode": Signals(t=float(k), arrivals={"f": (float(k), count)}, prompt_tokens=100.0,
                                 output_tokens=10.0, ongoing=60.0 if k < 60 else 0.0, running=1),
               "prefill": Signals(t=float(k), running=4)}
        current = app.decide(sig, current)
        if k < 60:  # decode's backlog makes it grow: prefill may not shrink meanwhile
            assert current["prefill"] == 4
    assert current == {"prefill": 2, "decode": 1}
    assert isinstance(app.pools["decode"].forecaster, ConstantForecaster)


def test_a_long_admission_wait_asks_for_one_more_replica_at_once():
    p = ForecastPolicy("decode", CURVE, _params(forecaster="constant", slo_ttft_s=1.0, service_fraction=0.5))
    calm = Signals(t=0, arrival_rps=1.0, output_tokens=10.0, queue_wait_s=0.1, running=3)
    p.observe(calm)
    assert p.need(calm, 3).now == 1
    waiting = Signals(t=1, arrival_rps=1.0, output_tokens=10.0, queue_wait_s=0.8, running=3)
    need = p.need(waiting, 3)
    assert need.now == 4 and need.urgent


def test_reactive_policy_is_in_flight_over_target():
    assert ReactivePolicy(4.0).desired(Signals(t=0, ongoing=10.0), 1) == 2.5


# -- the Serve glue, through Ray 2.60's wrappers ----------------------------------------------

def _ctx(dep, reps, target, t, agg, raw, config, state=None):
    from ray.serve.config import AutoscalingContext

    return AutoscalingContext(
        deployment_id=dep, deployment_name=dep.name, app_name=dep.app_name, current_num_replicas=target,
        target_num_replicas=target, running_replicas=reps, total_num_requests=0.0, total_queued_requests=0.0,
        aggregated_metrics=agg, raw_metrics=raw, capacity_adjusted_min_replicas=1,
        capacity_adjusted_max_replicas=6, policy_state=state or {}, last_scale_up_time=None,
        last_scale_down_time=None, current_time=t, config=config)


def test_pool_policy_runs_inside_serves_wrapper(caplog):
    from ray.serve._private.autoscaling_state import _resolve_policy_callable
    from ray.serve._private.common import DeploymentID, ReplicaID, TimeStampedValue
    from ray.serve.autoscaling_policy import _apply_autoscaling_config
    from ray.serve.config import AutoscalingConfig

    base = {"min_replicas": 1, "max_replicas": 6, "initial_replicas": 1, "target_ongoing_requests": 6}
    conf = AutoscalingConfig(**glue.forecast_autoscaling(base, "decode", ForecastAutoscaling(),
                                                          capacity.load(capacity.DEFAULT_CURVE)))
    assert conf.upscale_delay_s == 0 and conf.policy.policy_function == glue.FORECAST_POLICY
    policy = _apply_autoscaling_config(_resolve_policy_callable(conf.policy))
    dep = DeploymentID(name="decode", app_name="default")
    reps = [ReplicaID(unique_id="r0", deployment_id=dep)]
    n, state = 1, {}
    serve_log = logging.getLogger("ray.serve")  # Ray's loggers do not propagate to the root's
    serve_log.addHandler(caplog.handler)
    try:
        for k in range(40):  # 20 req/s of 64 output tokens: 1280 tokens/s, 0.8 x 414.55 each -> 4
            t = 1000.0 + 5 * k
            raw = {glue.ARRIVALS: {reps[0]: [TimeStampedValue(t, 100.0 * k)]}}
            agg = {glue.METRIC: {reps[0]: 5.0}, glue.OUTPUT_TOKENS: {reps[0]: 64.0}}
            with caplog.at_level("INFO", logger="ray.serve"):
                n, state = policy(_ctx(dep, reps, n, t, agg, raw, conf, state))
    finally:
        serve_log.removeHandler(caplog.handler)
    assert n == 4 and state["baton_need"]["ahead"] == 4
    moves = [r.getMessage() for r in caplog.records if "baton autoscaling decode" in r.getMessage()]
    assert moves and "-> 4" in moves[-1] and "forecast_rps" in moves[-1]  # each move says why


def test_app_policy_runs_inside_serves_app_level_wrapper():
    from ray.serve._private.autoscaling_state import _resolve_policy_callable
    from ray.serve._private.common import DeploymentID, ReplicaID, TimeStampedValue
    from ray.serve.autoscaling_policy import _apply_app_level_autoscaling_config
    from ray.serve.config import AutoscalingConfig, AutoscalingPolicy

    base = {"min_replicas": 1, "max_replicas": 6, "initial_replicas": 1, "target_ongoing_requests": 6}
    fc, curves = ForecastAutoscaling(), capacity.load(capacity.DEFAULT_CURVE)
    spec = glue.app_autoscaling_policy({"prefill": ("prefill", base), "decode": ("decode", base)}, fc, curves)
    policy = _apply_app_level_autoscaling_config(_resolve_policy_callable(AutoscalingPolicy(**spec)))
    deps = {n: DeploymentID(name=n, app_name="default") for n in ("prefill", "decode")}
    confs = {n: AutoscalingConfig(**glue.forecast_autoscaling(base, n, fc, curves)) for n in deps}
    current, states = {n: 1 for n in deps}, {}
    for k in range(40):
        t = 1000.0 + 5 * k
        ctxs = {}
        for name, dep in deps.items():
            rep = ReplicaID(unique_id=name, deployment_id=dep)
            raw = {glue.ARRIVALS: {rep: [TimeStampedValue(t, 45.0 * k)]}} if name == "decode" else {}
            agg = {glue.METRIC: {rep: 2.0}, glue.PROMPT_TOKENS: {rep: 400.0}, glue.PREFIX_HIT: {rep: 0.25},
                   glue.OUTPUT_TOKENS: {rep: 64.0}} if name == "decode" else {glue.METRIC: {rep: 2.0}}
            ctxs[dep] = _ctx(dep, [rep], current[name], t, agg, raw, confs[name], states.get(dep))
        decisions, states = policy(ctxs)
        current = {dep.name: n for dep, n in decisions.items()}
    # 9 req/s: prefill 9 x 300 tokens at batch 3 (0.72 s of the 0.75 s budget), 0.8 x 1249.0 each -> 3;
    # decode 9 x 64 at batch 8, 0.8 x 414.55 each -> 2
    assert current == {"prefill": 3, "decode": 2}


def test_signal_meter_reports_interval_means_from_the_front_metrics():
    from deployments.front.metrics import IngressMetrics

    m = IngressMetrics()
    meter = glue.SignalMeter(min_interval_s=1.0)
    meter.arrived("/v1/chat/completions", public=True)
    meter.arrived("/v1/chat/completions", public=False)  # forwarded by another front: counted there
    meter.arrived("/health", public=True)
    first = meter.report(0.0, 3, m)
    assert first == {glue.METRIC: 3.0, glue.ARRIVALS: 1.0, glue.PERMITS: 0.0}
    m.usage_tokens.labels("t", "baton-tiny", "prompt").inc(800)
    m.usage_tokens.labels("t", "baton-tiny", "cached").inc(200)
    m.usage_tokens.labels("t", "baton-tiny", "completion").inc(128)
    m.usage_requests.labels("t", "baton-tiny").inc(2)
    m.queue.observe(0.5)
    m.permits.labels("t").set(3)
    got = meter.report(2.0, 1, m, batch=(1000, 64, 300))
    assert got[glue.PROMPT_TOKENS] == 400 and got[glue.OUTPUT_TOKENS] == 64 and got[glue.PREFIX_HIT] == 0.25
    assert got[glue.QUEUE_WAIT] == 0.5 and got[glue.PERMITS] == 3 and got[glue.BATCH_DUE] == 300
    assert meter.report(2.5, 1, m)[glue.PROMPT_TOKENS] == 400  # no new answers: the last means stay
