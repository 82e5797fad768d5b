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
"""

from __future__ import annotations

import os

SPIN_ENV = "BATON_SHM_SPIN_S"
POLL_MS = 1


def register() -> None:
    """Applies the settings named in the environment to this process's vLLM."""
    raw = os.environ.get(SPIN_ENV)
    if raw:
        limit_spin(float(raw))


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
