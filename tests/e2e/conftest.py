"""One real Baton stack (Redis, Mooncake, Ray, vLLM) shared by all e2e tests."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.processes import pid_alive
from bench.stack import StackProcess, write_config
from common.constants import REPO_ROOT as REPO
from deployments.api_keys import hash_key


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
        serve={"api_keys": {hash_key(KEY_A): "tenant-a", hash_key(KEY_B): "tenant-b"}},
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
