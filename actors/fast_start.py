"""Cold engines that start in seconds: a standby process with vLLM's engine imported.

A vLLM engine start on CPU spends most of its time importing: AsyncLLM spawns
the engine core process, which imports torch and vLLM (about 6 s here), and
the CPU platform spawns the worker, which imports them again. Sleep mode does
nothing on CPU, so waking a cold model means starting an engine.

`use_standby()` makes every later engine start of this process fork its
engine core from a standby: a forkserver forked from this process once it has
imported vLLM's engine (`_fork_standby`), which then imports what else an
engine core and its worker need (`actors.standby_preload`). The standby is
not a fresh Python that imports torch and vLLM again: that was about 18 s of
CPU, the largest share of a CPU replica's start. Two uses:
- cold models of a catalogue (`cold=True`): the standby also makes the engine
  core fork its worker instead of spawning it, so both forks start with
  everything imported and what is left of a wake is loading the weights and
  allocating the KV cache. They start niced, below the serving engines, and
  `serving_priority` lifts them once they serve.
- a replica's own CPU engine (`cold=False`, deployments/replica.py): the engine
  core keeps the replica's priority, and its worker is forked or spawned as
  Baton's vLLM plugin says (actors/vllm_plugin.py FORK_ENV).

Forking is safe here because the standby runs no OpenMP region before it
forks: the hazard that makes vLLM spawn CPU workers (libgomp is not
fork-safe once its thread pool ran) does not arise in a process that has only
imported modules, and the standby is forked before this process has an
engine. Nor has it started native libraries whose state a fork copies
half-held: a test process that had run Mooncake's transfer engine in-process
forked a standby whose engine worker then hung setting up Mooncake (CI
run63), so a process that has run either must not call `use_standby`. It is
forked from a process with threads (Ray's, the replica's loops), of which it
keeps only the forking one; it never calls into Ray, and it and its forks
leave by `os._exit`, so none of Ray's exit handlers runs outside the replica.
"""

from __future__ import annotations

import os
import socket
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
    The first call decides for the process: it imports vLLM's AsyncLLM here (what this process
    runs its engines with) and forks the standby from this process; call it before this process
    starts an engine or runs OpenMP or Mooncake (see the module's docstring). Changes process-wide
    state: this process's environment (MODE_ENV, which the standby inherits) and vLLM's engine
    launcher's multiprocessing context. Idempotent; returns the context."""
    global _context
    if _context is None:
        from multiprocessing import forkserver

        import vllm.v1.engine.async_llm  # noqa: F401 - what the standby starts with
        import vllm.v1.engine.utils as launcher

        os.environ[MODE_ENV] = "cold" if cold else "primary"
        ctx = _StandbyContext()
        ctx.set_forkserver_preload(PRELOAD)
        _fork_standby(forkserver._forkserver, PRELOAD)

        launcher.get_mp_context = lambda: ctx
        _context = ctx
    return _context


def _fork_standby(server, preload: list[str]) -> None:
    """Starts `server` (multiprocessing's forkserver) as a fork of this process instead of a fresh
    Python: the same socket protocol as `ForkServer.ensure_running`, so the context's processes
    start through it unchanged. Changes `server`'s address, alive pipe and pid. Should the standby
    die, the next start spawns a fresh one (`ensure_running`), slower but the same."""
    from multiprocessing import connection, forkserver, resource_tracker

    with server._lock:
        resource_tracker.ensure_running()  # its fd is passed to every process, as ensure_running does
        if server._forkserver_pid is not None:
            return
        address = connection.arbitrary_address("AF_UNIX")
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(address)
            os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the standby: serves forks until its parent is gone, never returns
                code = 1
                try:
                    os.close(alive_w)
                    _retitle_through_ray()
                    forkserver.main(listener.fileno(), alive_r, preload)
                    code = 0
                except SystemExit as exc:  # the parent's pipe closed, or a signal's handler exited
                    code = exc.code if isinstance(exc.code, int) else 0
                finally:
                    os._exit(code)  # no exit handlers: Ray's would run in a copy of the replica
            os.close(alive_r)
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid


def _retitle_through_ray() -> None:
    """Titles this fork of a Ray worker "BATON::Standby", and has its forks retitle themselves
    through Ray's setproctitle: once Ray retitled a process, the `setproctitle` package cannot, so
    its forks would keep the replica's title instead of vLLM's ("VLLM::EngineCore"), which tests,
    benches and `ps` find engines by. Changes this process's title and `setproctitle.setproctitle`."""
    import sys

    raylet = sys.modules.get("ray._raylet")
    if raylet is None:  # not a Ray worker: the package retitles as it should
        return
    import setproctitle

    setproctitle.setproctitle = raylet.setproctitle
    raylet.setproctitle("BATON::Standby")


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
