"""The standby forkserver's processes run in their parent's environment as it is when each starts
(actors/fast_start.py), not as it was when the forkserver started: vLLM sets variables for its engine
core just before starting it. And they can still retitle themselves, as vLLM's engine core does
(tests and benches find it as "VLLM::EngineCore")."""

from __future__ import annotations

import os
import subprocess
import sys

from common.constants import REPO_ROOT

SCRIPT = """
import multiprocessing.forkserver, os
from actors.fast_start import _StandbyContext
from tests.unit.test_fast_start import report

if __name__ == "__main__":
    ctx = _StandbyContext()
    ctx.set_forkserver_preload([])
    multiprocessing.forkserver.ensure_running()  # started before the variable is set
    os.environ["BATON_TEST_LATE"] = "late"
    os.environ.pop("BATON_TEST_GONE")
    q = ctx.Queue()
    p = ctx.Process(target=report, args=(q,))
    p.start()
    print(q.get(timeout=60))
    p.join(60)
"""


def report(q) -> None:
    import setproctitle

    setproctitle.setproctitle("BATON::Retitled")
    with open("/proc/self/cmdline", "rb") as f:
        titled = b"BATON::Retitled" in f.read()
    q.put(f"{os.environ.get('BATON_TEST_LATE')} {os.environ.get('BATON_TEST_GONE')} {titled}")


def test_a_forked_engine_core_sees_the_environment_at_its_start():
    env = {**os.environ, "BATON_TEST_GONE": "early", "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["late", "None", "True"], out.stdout
