"""Cold engines that start in seconds: a standby process with vLLM's engine imported.

A vLLM engine start on CPU spends most of its time importing: AsyncLLM spawns
the engine core process, which imports torch and vLLM (about 6 s here), and
the CPU platform spawns the worker, which imports them again. Sleep mode does
nothing on CPU, so waking a cold model means starting an engine.

`use_standby()` makes every later engine start of this process fork its
engine core from a forkserver that preloaded `actors.standby_preload` (vLLM's
engine core, CPU worker and model modules). The forkserver is started at once,
before this process imports vLLM itself, so its imports run beside this
process's own, on another core, not after them. Two uses:
- cold models of a catalogue (`cold=True`): the standby also makes the engine
  core fork its worker instead of spawning it, so both forks start with
  everything imported and what is left of a wake is loading the weights and
  allocating the KV cache. They start niced, below the serving engines, and
  `serving_priority` lifts them once they serve.
- a replica's own CPU engine (`cold=False`, deployments/replica.py): the engine
  core keeps the replica's priority, and its worker is forked or spawned as
  Baton's vLLM plugin says (actors/vllm_plugin.py FORK_ENV). What it saves is
  the wall time of one vLLM import where a core is free (a replica started
  alone, or replacing one that died).

Forking is safe here because the forkserver runs no OpenMP region before it
forks: the hazard that makes vLLM spawn CPU workers (libgomp is not
fork-safe once its thread pool ran) does not arise in a process that has only
imported modules.
"""

from __future__ import annotations

import os
from multiprocessing.context import ForkServerContext, ForkServerProcess

PRELOAD = ["actors.standby_preload"]
MODE_ENV = "BATON_STANDBY"  # "cold" or "primary": what the standby's forks are (actors/standby_preload.py)
_context = None


class _EnvProcess(ForkServerProcess):
    """A process forked from the standby that runs in its parent's environment as it was at
    `start()`, as a spawned one would: vLLM sets variables for its engine core just before starting
    it (the CPU platform's thread and allocator settings, LD_PRELOAD for the processes it execs)."""

    def start(self) -> None:
        self._environ = dict(os.environ)
        super().start()

    def run(self) -> None:
        # Only what differs: unsetting every variable first leaves the C environment where
        # setproctitle cannot retitle the process ("VLLM::EngineCore").
        for key in set(os.environ) - set(self._environ):
            del os.environ[key]
        os.environ.update({k: v for k, v in self._environ.items() if os.environ.get(k) != v})
        super().run()


class _StandbyContext(ForkServerContext):
    Process = _EnvProcess


def use_standby(cold: bool = True):
    """Routes this process's vLLM engine-core starts through the standby forkserver, starting it now.

    `cold`: the engines are cold models' (niced, their worker forked); else a replica's own engine.
    The first call decides for the process. Changes process-wide state: this process's environment
    (MODE_ENV, which the standby inherits) and vLLM's engine launcher's multiprocessing context.
    Idempotent; returns the context."""
    global _context
    if _context is None:
        from multiprocessing import forkserver

        os.environ[MODE_ENV] = "cold" if cold else "primary"
        ctx = _StandbyContext()
        ctx.set_forkserver_preload(PRELOAD)
        forkserver.ensure_running()  # the standby imports from now on, beside this process

        import vllm.v1.engine.utils as launcher

        launcher.get_mp_context = lambda: ctx
        _context = ctx
    return _context


def serving_priority(pids: list[int], below: int = 0) -> None:
    """Gives every thread of `pids` (an engine's processes) this process's priority, or `below` nice
    steps under it: a woken engine started niced (actors/standby_preload.py). Where raising a priority
    is not permitted (it needs CAP_SYS_NICE or RLIMIT_NICE), threads keep the lower one."""
    import psutil

    nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + below)
    for pid in pids:
        try:
            for thread in psutil.Process(pid).threads():
                os.setpriority(os.PRIO_PROCESS, thread.id, nice)
        except (OSError, psutil.Error):
            continue


def can_raise_priority() -> bool:
    """Whether this process may give a niced thread its own priority back (root, or RLIMIT_NICE)."""
    import resource

    mine = os.getpriority(os.PRIO_PROCESS, 0)
    return os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20 - mine
