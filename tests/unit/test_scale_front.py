"""`baton bench scale`'s front part, its pure pieces: which system is which, whose CPU a process is, the ratios."""

from bench.scale.scale import _role, ratios, replicas_of


def test_a_systems_name_gives_its_replicas_per_pool():
    assert [replicas_of(s) for s in ("baton", "baton_x4", "baton_pd", "baton_pd_x2", "vllm_serve")] == [1, 4, 1, 2, 1]
    assert [replicas_of(s) for s in ("baton_nolimit", "baton_pd_x2_nolimit", "baton_x4_nolimit")] == [1, 2, 4]


def test_a_nolimit_system_runs_admission_without_its_lag_limit(tmp_path):
    from bench.scale.scale import baton_config
    from common.config import load_config

    on = load_config(baton_config(tmp_path / "on", {}, 1, 16, True), environ={})
    off = load_config(baton_config(tmp_path / "off", {}, 1, 16, True, lag_limit=False), environ={})
    assert on.admission.max_loop_lag_s == 0.015 and off.admission.max_loop_lag_s is None
    assert off.prefill.replicas == on.prefill.replicas == 1 and not off.colocated


def test_each_process_counts_in_its_own_role():
    assert _role("ray::ServeReplica:baton:decode") == "front"
    assert _role("ray::ServeReplica:baton:prefill") == "prefill"
    assert _role("ray::ServeReplica:baton:kv_indexer") == "indexer"
    assert _role("VLLM::EngineCore") == "engine"
    assert _role("python -m vllm.entrypoints.openai.api_server --model m") == "front"
    assert _role("haproxy -f cfg") == "ingress" and _role("redis-server *:6379") == "redis"
    assert _role("mooncake_master --port 1") == "other"


def _row(rate, goodput, added_p99):
    return {"offered_rps": rate, "goodput_rps": goodput, "added_p99_ms": added_p99}


def test_every_baton_system_is_compared_at_vllm_serves_knee_and_per_rate():
    results = {"vllm_serve": [_row(100, 98.0, 20.0), _row(200, 196.0, 40.0)],
               "baton": [_row(100, 98.0, 22.0), _row(200, 194.04, None)],
               "baton_pd": [_row(100, 98.0, 50.0)]}
    assert ratios(results) == {"baton_goodput_at_vllm_knee": 0.99, "baton_added_p99_over_vllm_ms": {"100": 2.0},
                               "baton_pd_added_p99_over_vllm_ms": {"100": 30.0}}  # no row at the knee: no ratio
    late = {"vllm_serve": [_row(20, 0.0, None)], "baton": [_row(20, 0.0, None)]}  # every answer past the SLO
    assert ratios(late) == {"baton_added_p99_over_vllm_ms": {}}
    assert ratios({"baton": [_row(100, 98.0, 20.0)]}) == {}
