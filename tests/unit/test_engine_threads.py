"""The launcher's split of a machine's cores among its CPU engines, and where build_app applies it."""

from __future__ import annotations

from common.config import BatonConfig
from common.engine_threads import local_engines, thread_env
from deployments.app import _threads


def test_one_engine_keeps_vllms_binding():
    assert thread_env(1, 2) == {}
    assert thread_env(0, 8) == {}


def test_engines_split_the_cores_unbound():
    assert thread_env(2, 2) == {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    assert thread_env(2, 16)["OMP_NUM_THREADS"] == "8"
    assert thread_env(3, 16)["OMP_NUM_THREADS"] == "5"


def test_more_engines_than_cores_run_one_thread_each():
    assert thread_env(4, 2)["OMP_NUM_THREADS"] == "1"


def test_engines_of_a_local_stack():
    assert local_engines(colocated=False, prefill_replicas=1, decode_replicas=1) == 2
    assert local_engines(colocated=False, prefill_replicas=2, decode_replicas=2) == 4
    assert local_engines(colocated=True, prefill_replicas=3, decode_replicas=1) == 1  # no prefill pool


def test_a_pool_that_sets_its_threads_or_has_gpus_keeps_them():
    split = thread_env(2, 2)
    cfg = BatonConfig.model_validate({"prefill": {"env": {"VLLM_CPU_OMP_THREADS_BIND": "0"}},
                                      "decode": {"resources": {"num_gpus": 1}}})
    assert _threads(cfg.prefill, split) == {}
    assert _threads(cfg.decode, split) == {}
    assert _threads(BatonConfig().prefill, split) == split


def test_engines_that_use_the_store_bound_its_transfers():
    """A stopped store must not hold a load for Mooncake's default 30 s (docs/bench_chaos.md)."""
    from pathlib import Path

    from deployments.app import _engine_env

    cfg = BatonConfig.model_validate({"mooncake": {"transfer_timeout_s": 4}})
    env = _engine_env(cfg, Path("/tmp/mooncake.json"))
    assert env["MOONCAKE_CONFIG_PATH"] == "/tmp/mooncake.json"
    assert env["MC_TCP_STATUS_TIMEOUT_SEC"] == env["MC_TCP_PROGRESS_TIMEOUT_SEC"] == env["MC_TRANSFER_TIMEOUT"] == "4"
    assert _engine_env(cfg, None) == {}  # no store: nothing to bound
    assert BatonConfig().mooncake.transfer_timeout_s == 5
