"""Imported once by the standby forkserver (actors/fast_start.py), never by a serving process.

Imports what an engine core and its CPU worker import, so each engine forked
from the standby has them already. For cold models (`BATON_STANDBY=cold`, the
default) it also makes the engine core fork its worker (vLLM's CPU platform
spawns it, which imports everything again), and every engine starts at nice
WAKE_NICE, so a cold model's start takes the cores the serving models leave;
the host puts it back once it serves. A replica's own engine
(`BATON_STANDBY=primary`) keeps the replica's priority and starts its worker
as Baton's vLLM plugin says.

Every process of the chain dies with its parent: the forkserver with the
replica that started it, an engine core with the forkserver, a worker with its
engine core (Linux's parent-death signal, set again after every fork since a
fork clears it). A replica killed outright leaves no engine behind.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal

from actors.fast_start import MODE_ENV

import vllm.model_executor.models.llama  # noqa: F401 - the catalogue's architecture
import vllm.v1.engine.core  # noqa: F401 - the engine core process's entry point
import vllm.v1.executor.multiproc_executor as executor
import vllm.v1.worker.cpu_model_runner  # noqa: F401
import vllm.v1.worker.cpu_worker  # noqa: F401

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Asks Linux to send this process SIGTERM when its parent exits (vLLM shuts down on SIGTERM)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: processes are cleaned up by their parents only
        return
    if os.getppid() == 1:  # the parent was already gone before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)


WAKE_NICE = 10  # an engine starts below the serving engines' priority (fast_start.serving_priority undoes it)


COLD = os.environ.get(MODE_ENV, "cold") == "cold"  # else a replica's own engine: no nice, its plugin's worker start


def _in_child() -> None:
    die_with_parent()
    if not COLD:
        return
    try:  # absolute, so the worker forked from a niced engine core is not niced twice
        os.setpriority(os.PRIO_PROCESS, 0, max(os.getpriority(os.PRIO_PROCESS, 0), WAKE_NICE))
    except OSError:
        pass


die_with_parent()
os.register_at_fork(after_in_child=_in_child)
if COLD:
    executor.get_mp_context = lambda: multiprocessing.get_context("fork")
