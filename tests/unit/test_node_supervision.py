"""The `ray up` node scripts supervise what they start (cluster/ray_up/scripts/common.sh).

On real processes, without a Ray cluster: a Redis killed on the head comes back on
its port with what its append-only file kept, as `baton up` revives its children;
a command that cannot start is reported, not restarted forever; stopping leaves
nothing behind.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import redis

from common.constants import REPO_ROOT
from common.processes import free_ports, pid_alive

COMMON = REPO_ROOT / "cluster" / "ray_up" / "scripts" / "common.sh"


def _sh(node_dir: Path, script: str, timeout: float = 30, backoff_s: int = 1) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(node_dir), "BATON_NODE_DIR": str(node_dir),
           "BATON_RESTART_BACKOFF_S": str(backoff_s)}
    return subprocess.run(["bash", "-c", f'. "{COMMON}"; {script}'], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _children(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children()


def _until(check, timeout_s: float = 15.0):
    deadline = time.monotonic() + timeout_s
    while not (out := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return out


@pytest.fixture
def node_dir(tmp_path):
    yield tmp_path
    for pidfile in tmp_path.glob("*.pid"):  # whatever a failed test left running
        _sh(tmp_path, f"stop_daemon {pidfile.stem}")


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed (make sysdeps)")
def test_a_killed_redis_comes_back_with_its_data_and_stops_for_good(node_dir):
    port = free_ports(1)[0]
    start = _sh(node_dir, f'start_daemon redis "$(command -v redis-server)" --bind 127.0.0.1 --port {port} '
                          f'--save "" --appendonly yes --appendfsync always --dir "{node_dir}" && '
                          f'wait_port redis 127.0.0.1 {port} 15')
    assert start.returncode == 0, start.stderr
    supervisor = int((node_dir / "redis.pid").read_text())
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    client.set("kept", "yes")
    [first] = _until(lambda: _children(supervisor))
    first.send_signal(signal.SIGKILL)
    second = _until(lambda: [c for c in _children(supervisor) if c.pid != first.pid])
    assert _until(lambda: _answers(client)) and client.get("kept") == b"yes"
    assert "restarting it" in (node_dir / "logs" / "redis.log").read_text()
    stop = _sh(node_dir, "stop_daemon redis")
    assert stop.returncode == 0, stop.stderr
    assert not pid_alive(supervisor) and not pid_alive(second[0].pid)
    assert not (node_dir / "redis.pid").exists()


def _answers(client) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def test_a_command_that_cannot_start_is_reported_not_restarted(node_dir):
    """wait_port sees the supervisor gone and fails with the log's tail. "Right after its start" is
    within the backoff, counted in whole seconds (bash's SECONDS): with the other tests' 1 s, a start
    that straddles a second's turn counted as a late exit and was restarted (run122, under load)."""
    port = free_ports(1)[0]
    out = _sh(node_dir, f"start_daemon broken /bin/false && wait_port broken 127.0.0.1 {port} 15", backoff_s=10)
    assert out.returncode != 0 and "broken exited" in out.stderr, out.stderr
    assert "not restarting it" in (node_dir / "logs" / "broken.log").read_text()
