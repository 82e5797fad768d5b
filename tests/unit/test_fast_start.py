"""The standby forkserver's processes run in their parent's environment as it is when each starts
(actors/fast_start.py), not as it was when the forkserver started: vLLM sets variables for its engine
core just before starting it. And they can still retitle themselves, as vLLM's engine core does
(tests and benches find it as "VLLM::EngineCore"). A replica's standby, forked from a process with
threads instead of started fresh, serves the same and leaves with its parent."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from common.constants import REPO_ROOT
from common.processes import pid_alive

SCRIPT = """
import multiprocessing.forkserver, os, sys, threading, time
from actors.fast_start import _StandbyContext, _fork_standby
from tests.unit.test_fast_start import report

if __name__ == "__main__":
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()  # a replica has threads
    ctx = _StandbyContext()
    ctx.set_forkserver_preload([])
    server = multiprocessing.forkserver._forkserver
    if sys.argv[1] == "forked":
        _fork_standby(server, [])
    multiprocessing.forkserver.ensure_running()  # started before the variable is set (a no-op if forked)
    os.environ["BATON_TEST_LATE"] = "late"
    os.environ.pop("BATON_TEST_GONE")
    q = ctx.Queue()
    p = ctx.Process(target=report, args=(q,))
    p.start()
    print(q.get(timeout=60), p.pid, server._forkserver_pid)
    p.join(60)
"""


def report(q) -> None:
    import setproctitle

    setproctitle.setproctitle("BATON::Retitled")
    with open("/proc/self/cmdline", "rb") as f:
        titled = b"BATON::Retitled" in f.read()
    q.put(f"{os.environ.get('BATON_TEST_LATE')} {os.environ.get('BATON_TEST_GONE')} {titled} {os.getppid()}")


@pytest.mark.parametrize("standby", ["spawned", "forked"])
def test_a_forked_engine_core_sees_the_environment_at_its_start(standby):
    env = {**os.environ, "BATON_TEST_GONE": "early", "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, standby], cwd=REPO_ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    late, gone, titled, parent, child, server = out.stdout.split()
    assert [late, gone, titled] == ["late", "None", "True"], out.stdout
    assert parent == server != child, out.stdout  # forked by the standby, not by the script
    deadline = time.monotonic() + 10
    while pid_alive(int(server)) and time.monotonic() < deadline:  # the standby leaves with its parent
        time.sleep(0.1)
    assert not pid_alive(int(server))
