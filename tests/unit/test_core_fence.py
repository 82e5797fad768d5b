"""common/core_fence.py: which cores are left for the processes beside a bound CPU engine."""

import os
import subprocess
import sys

import psutil
import pytest

from common import core_fence


def test_free_cores_leaves_the_unbound_ones():
    assert core_fence.free_cores({0, 1}, {0}) == {1}
    assert core_fence.free_cores({0, 1, 2, 3}, {0, 1}) == {2, 3}


def test_nothing_moves_without_a_bound_worker_or_a_core_left():
    assert core_fence.free_cores({0, 1}, set()) == set()  # unbound workers (GPU, thread split)
    assert core_fence.free_cores({0, 1}, {0, 1}) == set()  # workers on every core


class _Proc:
    def __init__(self, pid, name):
        self.pid, self._name = pid, name

    def name(self):
        return self._name


def test_bound_cores_counts_only_workers_on_a_strict_subset():
    allowed = set(os.sched_getaffinity(0))
    me = os.getpid()
    # This process is unbound (its mask is `allowed`), so even named as a worker it binds nothing.
    assert core_fence.bound_cores([_Proc(me, core_fence.WORKER_NAME)], allowed) == set()
    assert core_fence.bound_cores([_Proc(me, "python")], allowed | {max(allowed) + 1}) == set()
    assert core_fence.bound_cores([_Proc(me, core_fence.WORKER_NAME)], allowed | {max(allowed) + 1}) == allowed


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_fence_moves_every_thread_off_a_bound_workers_core():
    """A real process titled as vLLM's worker, bound to one core, and a threaded process beside it."""
    first = min(os.sched_getaffinity(0))
    worker = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time, setproctitle\n"
        f"os.sched_setaffinity(0, {{{first}}}); setproctitle.setproctitle('{core_fence.WORKER_NAME}')\n"
        "print('up', flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    other = subprocess.Popen([sys.executable, "-c", (
        "import threading, time\n"
        "[threading.Thread(target=time.sleep, args=(60,), daemon=True).start() for _ in range(3)]\n"
        "print('up', flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "up" and other.stdout.readline().strip() == "up"
        rest = core_fence.fence([other.pid, worker.pid])
        assert rest == set(os.sched_getaffinity(0)) - {first}
        tids = os.listdir(f"/proc/{other.pid}/task")
        assert len(tids) >= 4
        assert all(set(os.sched_getaffinity(int(t))) == rest for t in tids)
        assert set(os.sched_getaffinity(worker.pid)) == {first}  # the worker itself is left alone
    finally:
        for p in (worker, other):
            p.kill()
            p.wait()


def test_unfence_takes_back_the_launchers_cpus(monkeypatch):
    allowed = set(os.sched_getaffinity(0))
    monkeypatch.delenv(core_fence.CPUS_ENV, raising=False)
    core_fence.unfence()  # unset: nothing changes
    assert set(os.sched_getaffinity(0)) == allowed
    monkeypatch.setenv(core_fence.CPUS_ENV, core_fence.cpus_env()[core_fence.CPUS_ENV])
    os.sched_setaffinity(0, {min(allowed)})
    try:
        core_fence.unfence()
        assert set(os.sched_getaffinity(0)) == allowed
    finally:
        os.sched_setaffinity(0, allowed)
