"""One real Baton stack (Redis, Mooncake, Ray, vLLM) shared by all e2e tests."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.processes import pid_alive
from bench.common.stack import StackProcess, write_config
from common.constants import REPO_ROOT as REPO
from deployments.api.api_keys import hash_key


PIN_TTL_S = 10
KEY_A, KEY_B = "key-tenant-a", "key-tenant-b"
CAPACITY_PER_REPLICA = 2  # 2 decode replicas: 4 engine permits, so overload is cheap to make


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("baton")
    s = StackProcess(write_config(
        workdir,
        decode={"replicas": 2},
        routing={"pin_ttl_s": PIN_TTL_S, "heartbeat_s": 1, "replica_timeout_s": 3},
        serve={"api_keys": {hash_key(KEY_A): "tenant-a", hash_key(KEY_B): "tenant-b"}, "engine_metrics": True},
        admission={"capacity_per_replica": CAPACITY_PER_REPLICA, "max_queue_per_tenant": 16},
    ))
    s.start()
    yield s
    # Ctrl-C/SIGTERM must leave nothing behind: `up` exits 0 and every
    # child it started (Redis, Mooncake master and store) is gone, including
    # children it restarted since (state.json has their current PIDs).
    current = json.loads((Path(s.cfg["state_dir"]) / "state.json").read_text())["children"]
    pids = set(s.children.values()) | set(current.values())
    assert s.stop() == 0, s.tail()
    time.sleep(1)
    assert [pid for pid in pids if pid_alive(pid)] == []


@pytest.fixture(scope="session")
def reference(stack):
    """Greedy tokens of a plain colocated vLLM engine on the same prompts."""
    out = subprocess.run([sys.executable, "-m", "tests.e2e.reference", str(stack.config)],
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(l for l in out.stdout.splitlines() if l.startswith("REFERENCE_JSON "))
    return json.loads(line.split(" ", 1)[1])


@pytest.fixture(scope="session")
def client(stack):
    from openai import OpenAI

    return OpenAI(base_url=f"{stack.url}/v1", api_key=KEY_A, max_retries=0, timeout=120)


_COLOCATED: dict = {}  # the running colocated stack, while tests that use it remain


@pytest.fixture
def colocated_stack(tmp_path_factory):
    """Baton colocated with two routed replicas (routing.colocated_router), keys required. Started by
    the first test that uses it and stopped after the last (pytest_runtest_teardown), so it runs
    beside the shared stack only while the agent API modules run."""
    if "stack" not in _COLOCATED:
        s = StackProcess(write_config(
            tmp_path_factory.mktemp("colocated"), colocated=True, decode={"replicas": 2, "kv_cache_gb": 0.25},
            serve={"api_keys": {hash_key(KEY_A): "tenant-a", hash_key(KEY_B): "tenant-b"},
                   "require_api_key": True},
            admission={"capacity_per_replica": CAPACITY_PER_REPLICA, "max_queue_per_tenant": 16}))
        s.start()
        _COLOCATED["stack"] = s
    return _COLOCATED["stack"]


def _needs_colocated(item) -> bool:
    spec = getattr(item, "callspec", None)
    return "colocated_stack" in item.fixturenames or (spec is not None and "colocated" in spec.params.values())


def _stop_colocated() -> None:
    s = _COLOCATED.pop("stack", None)
    if s is not None:
        assert s.stop() == 0, s.tail()


def pytest_runtest_teardown(item, nextitem):
    if _COLOCATED:
        items = item.session.items
        if not any(_needs_colocated(i) for i in items[items.index(item) + 1:]):
            _stop_colocated()


def pytest_sessionfinish(session, exitstatus):
    _stop_colocated()
