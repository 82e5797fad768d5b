"""Config loading: defaults, YAML, env overrides, and errors naming field and file."""

from __future__ import annotations

import pytest

from common.config import BatonConfig, ConfigError, load_config


def write(tmp_path, text: str):
    p = tmp_path / "baton.yaml"
    p.write_text(text)
    return p


def test_defaults_are_a_disaggregated_local_stack():
    cfg = load_config(None, environ={})
    assert not cfg.colocated
    assert cfg.prefill.replicas == cfg.decode.replicas == 1
    assert cfg.serve.host == "127.0.0.1"


def test_yaml_and_env_overrides(tmp_path):
    path = write(tmp_path, "decode:\n  replicas: 3\n  resources: {accelerator_type: L4, resources: {decode: 1}}\n")
    cfg = load_config(path, environ={"BATON__SERVE__PORT": "8123", "BATON__COLOCATED": "true"})
    assert cfg.decode.replicas == 3
    assert cfg.decode.resources.ray_actor_options() == {
        "num_cpus": 0, "num_gpus": 0, "accelerator_type": "L4", "resources": {"decode": 1}}
    assert cfg.serve.port == 8123 and cfg.colocated is True


@pytest.mark.parametrize("text, field", [
    ("prefill:\n  replicas: 0\n", "prefill.replicas"),
    ("decode:\n  replica: 2\n", "decode.replica"),
    ("serve:\n  port: http\n", "serve.port"),
    ("tracing:\n  exporter: jaeger\n", "tracing.exporter"),
    ("mooncake:\n  master_port: 8000\n", "mooncake.master_port"),
])
def test_bad_field_is_named_with_the_file(tmp_path, text, field):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_config(path, environ={})
    assert field in str(exc.value) and str(path) in str(exc.value)


def test_bad_env_override_is_named(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_config(None, environ={"BATON__DECODE__REPLICAS": "-1"})
    assert "decode.replicas" in str(exc.value) and "BATON__" in str(exc.value)


@pytest.mark.parametrize("text", ["prefill: [1, 2\n", "- just\n- a list\n"])
def test_malformed_yaml_is_one_clear_error(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_config(path, environ={})
    assert str(path) in str(exc.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml", environ={})


@pytest.mark.parametrize("text, routes, kv_role", [
    ("colocated: false\n", True, "kv_consumer"),  # disaggregated always routes; decode loads
    ("colocated: true\n", False, None),  # one replica: nothing to choose, a plain engine
    ("colocated: true\ndecode: {replicas: 2}\n", True, None),  # routed, each reuses its own cache
    ("colocated: true\ndecode: {replicas: 2}\nmooncake: {colocated_pool: true}\n", True, "kv_both"),
    ("colocated: true\ndecode: {autoscaling: {max_replicas: 3}}\n", True, None),
    ("colocated: true\ndecode: {replicas: 2}\nrouting: {colocated_router: false}\n", False, None),
    # The pool needs the router: an unrouted engine saving KV nobody could find would only cost.
    ("colocated: true\nrouting: {colocated_router: false}\nmooncake: {colocated_pool: true}\n", False, None),
])
def test_colocated_routes_when_there_is_a_choice(tmp_path, text, routes, kv_role):
    from actors.engine_args import engine_kwargs

    cfg = load_config(write(tmp_path, text), environ={})
    assert cfg.routes() is routes
    role = "colocated" if cfg.colocated else "decode"
    assert engine_kwargs(cfg, role).get("kv_transfer_config", {}).get("kv_role") == kv_role


def test_an_engine_on_the_timed_executor_gets_its_connector_in_the_same_role(tmp_path):
    from actors.engine_args import engine_kwargs
    from actors.sim import CONNECTOR, CONNECTOR_MODULE, EXECUTOR

    sim = "{engine_args: {distributed_executor_backend: " + EXECUTOR + "}}"
    cfg = load_config(write(tmp_path, f"prefill: {sim}\ndecode: {sim}\n"), environ={})
    for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        ktc = engine_kwargs(cfg, role)["kv_transfer_config"]
        assert (ktc["kv_connector"], ktc["kv_connector_module_path"], ktc["kv_role"]) == (CONNECTOR, CONNECTOR_MODULE,
                                                                                          kv_role)
    real = engine_kwargs(load_config(None, environ={}), "decode")["kv_transfer_config"]
    assert real["kv_connector"] == "BatonStoreConnector"


def test_master_gets_the_client_ttl_and_rpc_threads(tmp_path):
    from kvstore import mooncake

    cfg = BatonConfig.model_validate({"mooncake": {"client_ttl_s": 45, "master_rpc_threads": 4}}).mooncake
    argv = mooncake.master_process(cfg, tmp_path).argv
    assert "--client_ttl=45" in argv and "--rpc_thread_num=4" in argv


def test_a_step_budget_applies_unless_the_pool_sets_one(tmp_path):
    from actors.engine_args import engine_kwargs

    cfg = load_config(None, environ={})
    assert engine_kwargs(cfg, "colocated", 256)["max_num_batched_tokens"] == 256
    assert "max_num_batched_tokens" not in engine_kwargs(cfg, "colocated")  # vLLM's default
    own = load_config(write(tmp_path, "decode: {engine_args: {max_num_batched_tokens: 1024}}\n"), environ={})
    assert engine_kwargs(own, "decode", 256)["max_num_batched_tokens"] == 1024


def test_vllm_engine_series_are_on_with_gpu_engines_and_where_configured():
    from actors.engine_args import engine_kwargs

    cfg = BatonConfig()
    assert engine_kwargs(cfg, "decode")["disable_log_stats"] is True  # CPU: off by default
    assert engine_kwargs(cfg, "decode", gpu=True)["disable_log_stats"] is False
    on = BatonConfig(serve={"engine_metrics": True})
    assert engine_kwargs(on, "decode")["disable_log_stats"] is False
    assert engine_kwargs(on, "decode")["structured_outputs_config"] == {"backend": "xgrammar",
                                                                       "disable_any_whitespace": True}


def test_serves_delays_around_the_reactive_policy_are_settable(tmp_path):
    """docs/deploy.md's example sets them; unset, Serve keeps its own defaults."""
    from ray.serve.config import AutoscalingConfig

    from cluster.deploy import pool_autoscaling

    cfg = load_config(write(tmp_path, "prefill:\n  autoscaling: {max_replicas: 2, upscale_delay_s: 2}\n"), environ={})
    got = pool_autoscaling(cfg.prefill, "prefill")
    assert got["upscale_delay_s"] == 2.0 and "downscale_delay_s" not in got
    assert AutoscalingConfig(**got).upscale_delay_s == 2.0
    with pytest.raises(ConfigError, match="upscale_delay_s"):
        load_config(write(tmp_path, "prefill:\n  autoscaling: {upscale_delay_s: -1}\n"), environ={})
