"""Baton's vLLM plugin caps the shared-memory queue's spin and never sleeps unbounded.

Runs vLLM's own SpinCondition over real ZMQ sockets; no engine.
"""

from __future__ import annotations

import time

import pytest
import zmq

from actors import vllm_plugin


@pytest.fixture
def shm_broadcast():
    """vLLM's module, imported by the tests that use it: collecting the unit tests stays light."""
    from vllm.distributed.device_communicators import shm_broadcast

    return shm_broadcast


@pytest.fixture
def pair(tmp_path, monkeypatch, shm_broadcast):
    monkeypatch.setattr(shm_broadcast.SpinCondition, "wait", shm_broadcast.SpinCondition.wait)
    ctx = zmq.Context()
    address = f"ipc://{tmp_path}/notify"
    writer = shm_broadcast.SpinCondition(False, ctx, address)
    reader = shm_broadcast.SpinCondition(True, ctx, address, busy_loop_s=1)
    time.sleep(0.1)  # SUB joins
    yield writer, reader
    for s in (writer, reader):
        for sock in (s.local_notify_socket, s.read_cancel_socket, s.write_cancel_socket):
            if sock is not None:
                sock.close(linger=0)
    ctx.term()


def test_without_the_env_vllm_is_unchanged(monkeypatch, shm_broadcast):
    original = shm_broadcast.SpinCondition.wait
    monkeypatch.delenv(vllm_plugin.SPIN_ENV, raising=False)
    vllm_plugin.register()
    assert shm_broadcast.SpinCondition.wait is original


def test_spin_is_capped_and_a_lost_ping_costs_one_poll(pair, monkeypatch, shm_broadcast):
    writer, reader = pair
    original = shm_broadcast.SpinCondition.wait
    monkeypatch.setenv(vllm_plugin.SPIN_ENV, "0.002")
    vllm_plugin.register()
    vllm_plugin.register()  # loaded once per process by vLLM, but twice must not nest
    assert shm_broadcast.SpinCondition.wait.__wrapped_by_baton__ is original
    reader.record_read()
    time.sleep(0.01)  # past the 2 ms spin: the reader sleeps on its socket
    t0 = time.monotonic()
    reader.wait(timeout_ms=None)  # no ping will come: vLLM itself would block forever here
    assert time.monotonic() - t0 < 0.5
    assert reader.busy_loop_s == 0.002

    writer.notify()
    time.sleep(0.05)
    t0 = time.monotonic()
    reader.wait(timeout_ms=10_000)
    assert time.monotonic() - t0 < 0.5


def test_pool_config_sets_the_engines_env():
    """Null spins 0.1 s for an engine alone on its cores and 2 ms where engines share them;
    a value set in the config wins either way. CPU engines with unbound threads (the launcher's
    split) fork their worker; an engine alone keeps vLLM's binding and spawns it, as GPU ones do."""
    from common.config import load_config
    from common.engine_threads import thread_env
    from deployments.app import _plugin_env

    split = thread_env(2, 2)
    timed = {vllm_plugin.FIT_ENV: "1"}
    forked = {**timed, vllm_plugin.FORK_ENV: "1"}
    cfg = load_config(None, environ={})
    assert _plugin_env(cfg.decode, {}) == {vllm_plugin.SPIN_ENV: "0.1", **timed}
    assert _plugin_env(cfg.decode, split) == {vllm_plugin.SPIN_ENV: "0.002", **forked}
    cfg = load_config(None, environ={"BATON__DECODE__SHM_SPIN_S": "0.5"})
    assert _plugin_env(cfg.decode, split) == {vllm_plugin.SPIN_ENV: "0.5", **forked}
    cfg = load_config(None, environ={"BATON__DECODE__RESOURCES__NUM_GPUS": "1"})
    assert vllm_plugin.FORK_ENV not in _plugin_env(cfg.decode, split)


def test_fork_worker_makes_the_executor_fork_only_when_asked(monkeypatch):
    """`register` leaves vLLM's executor context alone without BATON_FORK_WORKER, and makes it
    fork with it (what the engine core then uses to start its worker)."""
    import vllm.v1.executor.multiproc_executor as executor

    original = executor.get_mp_context
    monkeypatch.setattr(executor, "get_mp_context", original)  # undone after the test
    monkeypatch.delenv(vllm_plugin.FORK_ENV, raising=False)
    vllm_plugin.register()
    assert executor.get_mp_context is original
    monkeypatch.setenv(vllm_plugin.FORK_ENV, "1")
    vllm_plugin.register()
    assert executor.get_mp_context().get_start_method() == "fork"


def test_baton_load_reports_empty_blocks_and_the_fitted_rates():
    """`baton_load` on a real vLLM BlockPool: a fresh pool is all empty; the rates appear once
    the engine's StepFit has seen MIN_FIT_STEPS steps."""
    from types import SimpleNamespace

    from vllm.v1.core.block_pool import BlockPool

    from routing.policy.rates import StepFit

    pool = BlockPool(num_gpu_blocks=64, enable_caching=True, hash_block_size=16)
    sched = SimpleNamespace(kv_cache_manager=SimpleNamespace(block_pool=pool), running=[], waiting=[])
    core = SimpleNamespace(scheduler=sched)
    out = vllm_plugin.baton_load(core)
    assert (out["kv_blocks"], out["kv_free_blocks"], out["kv_empty_blocks"]) == (64, 63, 63)  # one null block
    assert "prefill_s_per_token" not in out
    core._baton_fit = fit = StepFit(warmup=0)
    for i in range(vllm_plugin.MIN_FIT_STEPS):
        fit.observe(0.01 + 0.002 * (100 + i), 100 + i)
    out = vllm_plugin.baton_load(core)
    assert abs(out["prefill_s_per_token"] - 0.002) < 1e-4 and out["fit_steps"] == vllm_plugin.MIN_FIT_STEPS
