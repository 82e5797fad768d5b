"""Real servers for the unit tests that need one: a redis-server on loopback."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from common.processes import free_ports, port_open


def start_redis(directory) -> tuple[subprocess.Popen, str]:
    """A fresh redis-server on a free loopback port, without persistence; (process, URL)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed (make install does that)")
    port = free_ports(1)[0]
    proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no", "--dir", str(directory)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not port_open("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, f"redis://127.0.0.1:{port}/0"


def stop_redis(proc: subprocess.Popen) -> None:
    """Ends the server this test started (by its own handle), if it still runs."""
    if proc.poll() is None:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    proc, url = start_redis(tmp_path_factory.mktemp("redis"))
    yield url
    stop_redis(proc)


@pytest.fixture
def redis_proc(tmp_path):
    """A server of this test's own, which the test may kill: (process, URL)."""
    proc, url = start_redis(tmp_path)
    yield proc, url
    stop_redis(proc)
