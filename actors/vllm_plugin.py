"""Baton's vLLM general plugin: loaded by vLLM in every engine process.

vLLM calls `register` in the EngineCore and in each worker process
(`vllm.general_plugins` entry point, pyproject.toml). It changes nothing
unless the process's environment asks for it, so a plain `vllm serve` in
the same virtualenv (the benchmark's peer) runs unchanged.

- `BATON_SHM_SPIN_S`: how long a reader of vLLM's shared-memory queues
  (worker waiting for the next step, EngineCore waiting for the worker's
  output) spins with sched_yield after its last message before it sleeps
  on a socket. vLLM spins for 1 s, which keeps a core busy per waiting
  process; where engines share CPU cores with each other and with the
  front, that spinning takes the cores their computation needs. Set from
  `{pool}.shm_spin_s` (2 ms by default: under load the next step comes
  sooner than that, so only idle gaps sleep). A sleeping reader also wakes
  every POLL_MS to look again, since vLLM's wake-up ping can be lost.

It also gives vLLM's EngineCore a `baton_load` utility method (called by
the replica through `call_utility_async`, so it runs on the engine loop
between steps): the scheduler's running and waiting requests, its free
KV blocks (free or evictable) and total, and how long the oldest waiting
request has waited. Nothing calls it but Baton's replica.
"""

from __future__ import annotations

import os
import time

SPIN_ENV = "BATON_SHM_SPIN_S"
POLL_MS = 1


def register() -> None:
    """Applies the settings named in the environment to this process's vLLM, and adds
    `EngineCore.baton_load`."""
    raw = os.environ.get(SPIN_ENV)
    if raw:
        limit_spin(float(raw))
    from vllm.v1.engine.core import EngineCore

    if not hasattr(EngineCore, "baton_load"):
        EngineCore.baton_load = baton_load


def baton_load(core) -> dict:
    """The engine's load, read from its scheduler (changes nothing)."""
    sched = core.scheduler
    pool = sched.kv_cache_manager.block_pool
    waiting = list(getattr(sched, "waiting", ())) + list(getattr(sched, "kv_holding_waiting", ()))
    oldest = min((r.arrival_time for r in waiting if getattr(r, "arrival_time", None)), default=None)
    return {"running": len(sched.running), "waiting": len(waiting),
            "kv_free_blocks": int(pool.get_num_free_blocks()), "kv_blocks": int(pool.num_gpu_blocks),
            "oldest_wait_s": round(max(0.0, time.time() - oldest), 3) if oldest else 0.0}


def limit_spin(seconds: float) -> None:
    """Caps the busy-wait of every shared-memory queue reader in this process,
    those that exist and those made later, at `seconds`."""
    from vllm.distributed.device_communicators import shm_broadcast

    cls = shm_broadcast.SpinCondition
    original = getattr(cls.wait, "__wrapped_by_baton__", cls.wait)

    def wait(self, timeout_ms=None):
        if self.busy_loop_s > seconds:
            self.busy_loop_s = seconds
        # vLLM's wake-up (a conflated PUB/SUB ping) can be lost, which it
        # rarely notices after a second of spinning; a bounded sleep makes a
        # lost ping cost at most POLL_MS instead of a hang.
        return original(self, POLL_MS if timeout_ms is None else min(timeout_ms, POLL_MS))

    wait.__wrapped_by_baton__ = original
    cls.wait = wait
