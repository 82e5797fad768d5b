"""Baton's vLLM plugin caps the shared-memory queue's spin and never sleeps unbounded.

Runs vLLM's own SpinCondition over real ZMQ sockets; no engine.
"""

from __future__ import annotations

import time

import pytest
import zmq

from actors import vllm_plugin

shm_broadcast = pytest.importorskip("vllm.distributed.device_communicators.shm_broadcast")


@pytest.fixture
def pair(tmp_path, monkeypatch):
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


def test_without_the_env_vllm_is_unchanged(monkeypatch):
    original = shm_broadcast.SpinCondition.wait
    monkeypatch.delenv(vllm_plugin.SPIN_ENV, raising=False)
    vllm_plugin.register()
    assert shm_broadcast.SpinCondition.wait is original


def test_spin_is_capped_and_a_lost_ping_costs_one_poll(pair, monkeypatch):
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
    from common.config import load_config
    from deployments.app import _plugin_env

    cfg = load_config(None, environ={})
    assert _plugin_env(cfg.decode) == {vllm_plugin.SPIN_ENV: "0.002", vllm_plugin.FIT_ENV: "1"}
    cfg = load_config(None, environ={"BATON__DECODE__SHM_SPIN_S": "null"})
    assert _plugin_env(cfg.decode) == {vllm_plugin.FIT_ENV: "1"}
