"""Real servers for the unit tests that need one: a redis-server on loopback."""

from __future__ import annotations

import subprocess

import pytest

from common.processes import ManagedProcess, free_ports, redis_process


def start_redis(directory, appendfsync: str = "off") -> tuple[ManagedProcess, str]:
    """A redis-server on a free loopback port, persisting in `directory` as `appendfsync` says
    (none by default); (process, URL). `start()` on the process runs the same server again."""
    port = free_ports(1)[0]
    server = redis_process("127.0.0.1", port, directory, directory / f"redis-{port}.log", appendfsync)
    server.start()
    server.wait_ready(10)
    return server, f"redis://127.0.0.1:{port}/0"


def restart_redis(server: ManagedProcess) -> None:
    """Runs a stopped or killed `start_redis` server again: its port, directory and persistence,
    as `baton up`'s supervision restarts it (a persisting one loads its file)."""
    server.start()
    server.wait_ready(10)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    server, url = start_redis(tmp_path_factory.mktemp("redis"))
    yield url
    server.stop()


@pytest.fixture
def redis_proc(tmp_path) -> tuple[subprocess.Popen, str]:
    """A server of this test's own, which the test may stop or kill: (process, URL)."""
    server, url = start_redis(tmp_path)
    yield server.proc, url
    server.stop()
