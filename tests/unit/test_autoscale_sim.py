"""The autoscaling simulator and `baton bench autoscale` (bench/autoscale/), on short traces."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bench.autoscale import autoscale
from bench.autoscale.autoscale_metrics import aggregate
from bench.autoscale.autoscale_sim import POLICIES, Pool, ServeDelays, SimConfig, draw_requests, simulate
from bench.autoscale.autoscale_traces import Trace, default_traces, diurnal, ramp, spike, with_batch
from cli.main import BENCHES
from deployments.autoscaling.capacity import CurvePoint, PoolCurve, load_for_config

CURVES = load_for_config(None)
FAST = SimConfig(dt_s=0.5, warmup_s=60.0, sample_s=30.0)


def test_traces_have_their_shapes():
    r = ramp(low_rps=2, peak_rps=20, ramp_s=100, hold_s=100, flat_s=50)
    assert r.duration_s == 400 and r.rate(0) == 2 and r.rate(100) == 11 and r.rate(200) == 20 and r.rate(399) == 2
    d = diurnal(peak_rps=30, trough_rps=3, day_s=2400, days=1)
    assert d.rate(400) < 4 < 25 < d.rate(1600)  # 04:00 trough, 16:00 peak
    s = spike(base_rps=10, spike_factor=3, spike_s=10, at=(50,), duration_s=100)
    assert s.rate(55) == 30 and s.rate(65) == 10
    b = with_batch(r, 100, (10.0,), 60.0)
    assert b.name == "ramp_batch" and b.batch_jobs == ((10.0, 100, 60.0),)
    assert set(default_traces()) == {"diurnal", "ramp", "spike", "diurnal_batch"}


def test_serve_delays_wait_for_a_steady_wish():
    d = ServeDelays(1, 5, up_s=30, down_s=60)
    assert d.apply(0, 3.2, 2) == 2  # wants 4: the up delay starts
    assert d.apply(29, 3.9, 2) == 2
    assert d.apply(30, 4.0, 2) == 4
    assert d.apply(31, 9.0, 4) == 4 and d.apply(61, 9.0, 4) == 5  # bounded
    assert d.apply(70, 0.5, 5) == 5 and d.apply(100, 2.0, 5) == 5 and d.apply(130, 2.0, 5) == 2


def test_a_pool_serves_at_the_curves_rate_and_starts_replicas_late():
    curve = PoolCurve(points=[CurvePoint(batch=1, tokens_per_s=100), CurvePoint(batch=4, tokens_per_s=200)])
    pool = Pool(curve, start_s=10.0, initial=1)
    work = [100.0] * 4
    pool.queues[0].extend(range(4))
    done: list = []
    pool.step(0.0, 1.0, work, done)  # 4 at once: 50 tokens/s each
    assert done == [] and pool.in_flight() == 4
    pool.step(1.0, 1.0, work, done)
    assert sorted(rid for rid, _ in done) == [0, 1, 2, 3] and all(abs(t - 2.0) < 1e-9 for _, t in done)
    pool.set_target(2.0, 3)
    assert len(pool.replicas) == 3 and pool.ready(2.0) == 1 and pool.ready(12.0) == 3
    pool.set_target(3.0, 1)  # the starting ones go first
    assert pool.ready(3.0) == 1 and len(pool.replicas) == 1


def test_the_workload_is_the_same_for_every_policy():
    a, b = draw_requests(ramp(), FAST), draw_requests(ramp(), FAST)
    assert all((a[k] == b[k]).all() for k in a)
    assert abs(a["prompt"].mean() - 400) < 10 and abs(a["hit"].mean() - 0.25) < 0.02


def _short_ramp() -> Trace:
    return ramp(low_rps=2, peak_rps=20, ramp_s=120, hold_s=300, flat_s=240)


def test_every_policy_runs_and_reports():
    trace = ramp(low_rps=2, peak_rps=10, ramp_s=60, hold_s=120, flat_s=120)
    for policy in POLICIES:
        m = simulate(trace, FAST, CURVES, policy)
        assert m["requests"] > 1500 and 0 <= m["ttft_slo_misses"] <= m["requests"]
        assert set(m["replica_seconds_by_pool"]) == {"prefill", "decode"}
        assert m["series"] and {"t", "rate", "prefill_target", "decode_ready", "ttft_misses"} <= m["series"][0].keys()
    with pytest.raises(ValueError):
        simulate(_short_ramp(), FAST, CURVES, "oracle")


def test_forecast_beats_reactive_on_a_steep_ramp():
    cfg = replace(FAST, max_replicas=8)
    fc = simulate(_short_ramp(), cfg, CURVES, "forecast")
    re = simulate(_short_ramp(), cfg, CURVES, "reactive")
    assert fc["ttft_slo_misses"] < re["ttft_slo_misses"]
    assert fc["replica_seconds"] <= 1.1 * re["replica_seconds"]


def test_batch_work_is_deferred_and_finished_by_its_deadline():
    trace = with_batch(_short_ramp(), 2000, (100.0,), 700.0)
    m = simulate(trace, FAST, CURVES, "constant")
    assert m["batch_requests"] == 2000 and m["batch_late"] == 0
    sent = [p["batch_rps"] for p in m["series"]]
    assert max(sent) > 0 and sent[0] == 0


def test_aggregate_sums_over_seeds():
    one = {"requests": 10, "ttft_slo_misses": 2, "replica_seconds": 5.0, "direction_changes": {"prefill": 1},
           "max_direction_changes_per_10min": 1, "direction_changes_per_10min": 0.5, "ttft_p99_s": 1.0}
    two = {**one, "ttft_slo_misses": 4, "max_direction_changes_per_10min": 2}
    got = aggregate([one, two], [0, 1])
    assert got["ttft_slo_misses"] == 6 and got["requests"] == 20 and got["max_direction_changes_per_10min"] == 2
    assert got["direction_changes"] == {"prefill": 2} and [s["seed"] for s in got["per_seed"]] == [0, 1]


def test_targets_compare_forecast_with_reactive_and_constant():
    def run(misses, cost, changes=1):
        return {"ttft_slo_misses": misses, "replica_seconds": cost, "max_direction_changes_per_10min": changes}

    traces = {name: {"policies": {"reactive": run(100, 1000), "forecast": run(40, 1080),
                                  "constant_matched": run(60, 1080)}} for name in ("ramp", "diurnal")}
    got = autoscale.targets(traces)
    assert got["ramp_miss_reduction"] == 0.6 and got["ramp_replica_seconds_change"] == 0.08
    assert got["ramp_beats_constant_ok"] and got["met"]
    traces["diurnal"]["policies"]["forecast"] = run(40, 1200)
    assert not autoscale.targets(traces)["met"]


def test_bench_main_prints_one_json_line(capsys, tmp_path, monkeypatch):
    assert "autoscale" in BENCHES
    monkeypatch.setattr(autoscale, "default_traces",
                        lambda day_s=0: {"spike": spike(at=(200.0,), spike_s=60.0, duration_s=600.0)})
    out = tmp_path / "r.json"
    assert autoscale.main(["--traces", "spike", "--policies", "reactive", "constant", "--seeds", "0",
                           "--out", str(out), "--plot", str(tmp_path / "r.png")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["traces"]["spike"]["policies"]) == {"reactive", "constant"}
    assert "series" not in doc["traces"]["spike"]["policies"]["reactive"]
    assert json.loads(out.read_text())["targets"] == doc["targets"] and (tmp_path / "r.png").stat().st_size > 0
