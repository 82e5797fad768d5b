"""Keeps a machine's other processes off the cores its CPU engines compute on.

vLLM's CPU backend binds a lone engine's compute threads to some of the
machine's cores and leaves the rest "for everything else" (on 2 cores: the
worker on core 0), but nothing keeps everything else off the bound cores.
A Baton replica runs more beside its engine than `vllm serve` does (the
front, Ray's core-worker threads, the replica's heartbeat and load polls):
whenever the kernel places one of them on the worker's core, the worker
loses a time slice in the middle of a step, and every request's time per
output token grows with it. Measured on one stack on 2 cores, fence on and
off in alternate rounds (bench/serve/fence_ab.py, docs/bench_serve.md): fenced,
1.06x the throughput at concurrency 8 and 1.05x at concurrency 1 over two
runs of four pairs (1.16x and 1.07x in one, level in the other).

`fence(pids)` moves every thread of the given processes to the cores no
engine worker is bound to. A replica fences itself and its EngineCore once
its engine is up (deployments/replica.py); `baton up` fences the rest of the
stack (Ray's daemons and workers, Redis, Mooncake) once it is ready. Ray
starts later replicas from its fenced raylet, so each replica first takes
back the launcher's CPUs (`unfence`, from `CPUS_ENV`): vLLM binds its worker
to the first of the CPUs its process may use. Nothing happens where the
workers are not bound to a strict subset of the cores (GPU engines, the
launcher's thread split for several CPU engines, which leaves them unbound:
common/engine_threads.py) or where no core would be left.
"""

from __future__ import annotations

import os

import psutil

WORKER_NAME = "VLLM::Worker"  # vLLM's process title for its worker processes
CPUS_ENV = "BATON_CPUS"  # the CPUs `baton up` had before it fenced the stack


def bound_cores(procs, allowed: set[int]) -> set[int]:
    """The cores that CPU engine workers among `procs` (psutil processes) are bound to:
    the union of the masks of those bound to a strict subset of `allowed`."""
    cores: set[int] = set()
    for p in procs:
        try:
            if not p.name().startswith(WORKER_NAME):
                continue
            mask = set(os.sched_getaffinity(p.pid))
        except (psutil.Error, OSError):
            continue
        if mask < allowed:
            cores |= mask
    return cores


def free_cores(allowed: set[int], bound: set[int]) -> set[int]:
    """The cores left for other processes, or an empty set where fencing would leave none."""
    return allowed - bound if bound else set()


def fence(pids: list[int]) -> set[int]:
    """Moves every thread of the processes `pids` (not engine workers) off the cores this
    machine's engine workers are bound to. Changes those threads' CPU affinity; threads they
    start later inherit it. Returns the cores they now run on (empty: nothing changed)."""
    allowed = set(os.sched_getaffinity(0))
    rest = free_cores(allowed, bound_cores(psutil.process_iter(["name"]), allowed))
    if not rest:
        return set()
    move(pids, rest)
    return rest


def move(pids: list[int], cpus: set[int]) -> None:
    """Sets every thread of the processes `pids`, except engine workers, to `cpus`. Changes
    their CPU affinity; a process or thread that is gone, or not ours to move, is left alone."""
    for pid in pids:
        try:
            if psutil.Process(pid).name().startswith(WORKER_NAME):
                continue
            tids = os.listdir(f"/proc/{pid}/task")
        except (psutil.Error, OSError):
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(int(tid), cpus)
            except OSError:
                continue


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (a replica's: its EngineCore and workers; `fence` skips workers)."""
    root = psutil.Process(pid)
    return [pid, *(c.pid for c in root.children(recursive=True))]


def cpus_env() -> dict[str, str]:
    """The environment that lets a replica started after the fence take back this process's CPUs."""
    return {CPUS_ENV: ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))}


def unfence() -> None:
    """Gives every thread of this process the CPUs named in `CPUS_ENV`; nothing where it is unset
    (a cluster's replicas, not started by `baton up`). Changes those threads' CPU affinity."""
    raw = os.environ.get(CPUS_ENV)
    if not raw:
        return
    move([os.getpid()], {int(c) for c in raw.split(",")})
