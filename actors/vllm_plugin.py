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
  `{pool}.shm_spin_s` (deployments/app.py: 0.1 s for an engine alone on its
  cores, so it spins through every step under load and sleeps only in idle
  gaps; 2 ms where the launcher splits the cores between engines). A
  sleeping reader also wakes every POLL_MS to look again, since vLLM's
  wake-up ping can be lost.

- `BATON_FORK_WORKER=1`: the engine core forks its worker instead of
  spawning it (vLLM's CPU platform spawns it, which imports torch and vLLM a
  second time: about 7 s of CPU here, a third of a cold engine start). The
  engine core is itself a fresh spawned process that has run no OpenMP
  region when it forks, so libgomp's fork hazard (why vLLM spawns CPU
  workers) does not arise; the catalogue's standby (actors/fast_start.py)
  has forked its workers the same way since it was built.

- `BATON_FIT_RATES=1`: times the engine's steps (below).

- `BATON_SIM_EXECUTOR=<qualified name>`: every engine this process builds
  runs that executor (the timed one, actors/sim/), whatever its arguments
  said. Ray Serve LLM sets `distributed_executor_backend` itself ("mp" on
  CPU), so `baton bench scale` puts its peer on the simulated engine this way.

It also gives vLLM's EngineCore a `baton_load` utility method (called by
the replica through `call_utility_async`, so it runs on the engine loop
between steps): the scheduler's running and waiting requests, its free
KV blocks (free or evictable), its empty ones (free and caching nothing)
and total, how long the oldest waiting request has waited, and the
engine's measured speeds: `EngineCore.step` is timed, and each step's
duration, tokens computed and prompt tokens loaded through the KV connector
feed a `routing.policy.rates.StepFit` (seconds per token computed, per token
loaded, per step), which the router's cost (routing/policy/cost.py) prices
candidates with. Nothing calls it but Baton's replica.
"""

from __future__ import annotations

import os
import time

SPIN_ENV = "BATON_SHM_SPIN_S"
POLL_MS = 1
FIT_ENV = "BATON_FIT_RATES"
SIM_ENV = "BATON_SIM_EXECUTOR"
FORK_ENV = "BATON_FORK_WORKER"
MIN_FIT_STEPS = 20  # steps before the engine reports its fitted rates


def register() -> None:
    """Applies the settings named in the environment to this process's vLLM, and adds
    `EngineCore.baton_load`."""
    raw = os.environ.get(SPIN_ENV)
    if raw:
        limit_spin(float(raw))
    from vllm.v1.engine.core import EngineCore

    if not hasattr(EngineCore, "baton_load"):
        EngineCore.baton_load = baton_load
    if os.environ.get(FIT_ENV) == "1" and not hasattr(EngineCore.step, "__baton_timed__"):
        EngineCore.step = _timed(EngineCore.step)
        from vllm.v1.core.sched.scheduler import Scheduler

        Scheduler.schedule = _kept(Scheduler.schedule)
    if os.environ.get(SIM_ENV):
        _force_executor(os.environ[SIM_ENV])
    if os.environ.get(FORK_ENV) == "1":
        _fork_workers()


def _fork_workers() -> None:
    """Makes vLLM's multiprocessing executor in this process fork its workers. Only the engine core
    builds that executor; a worker's death still reaches it through vLLM's own death pipe."""
    import multiprocessing

    import vllm.v1.executor.multiproc_executor as executor

    executor.get_mp_context = lambda: multiprocessing.get_context("fork")


def _force_executor(qualname: str) -> None:
    """Makes `EngineArgs.create_engine_config` use the executor `qualname`."""
    from vllm.engine.arg_utils import EngineArgs

    original = getattr(EngineArgs.create_engine_config, "__baton_original__", EngineArgs.create_engine_config)

    def create_engine_config(self, *args, **kwargs):
        self.distributed_executor_backend = qualname
        return original(self, *args, **kwargs)

    create_engine_config.__baton_original__ = original
    EngineArgs.create_engine_config = create_engine_config


def _kept(schedule):
    """`Scheduler.schedule` that keeps its last output on the scheduler (`_baton_last`)."""
    def wrapper(self, *args, **kwargs):
        out = self._baton_last = schedule(self, *args, **kwargs)
        return out
    return wrapper


def _timed(step):
    """`EngineCore.step` that feeds the engine's StepFit with each step that ran the model."""
    from routing.policy.rates import StepFit

    def wrapper(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = step(self, *args, **kwargs)
        sched = self.scheduler
        so = getattr(sched, "_baton_last", None)
        if so is not None and so.total_num_scheduled_tokens > 0:
            sched._baton_last = None
            loaded = 0
            for new in so.scheduled_new_reqs:
                req = sched.requests.get(new.req_id)
                stats = getattr(req, "prefill_stats", None) if req is not None else None
                loaded += getattr(stats, "num_external_cached_tokens", 0) or 0
            fit = self.__dict__.get("_baton_fit")
            if fit is None:  # made once, not per step (setdefault would build one every step)
                fit = self._baton_fit = StepFit()
            fit.observe(time.perf_counter() - t0, so.total_num_scheduled_tokens, loaded)
        return out
    wrapper.__baton_timed__ = True
    return wrapper


def baton_load(core) -> dict:
    """The engine's load, read from its scheduler (changes nothing)."""
    sched = core.scheduler
    pool = sched.kv_cache_manager.block_pool
    waiting = list(getattr(sched, "waiting", ())) + list(getattr(sched, "kv_holding_waiting", ()))
    oldest = min((r.arrival_time for r in waiting if getattr(r, "arrival_time", None)), default=None)
    out = {"running": len(sched.running), "waiting": len(waiting),
           "kv_free_blocks": int(pool.get_num_free_blocks()), "kv_blocks": int(pool.num_gpu_blocks),
           "oldest_wait_s": round(max(0.0, time.time() - oldest), 3) if oldest else 0.0}
    try:  # free blocks that cache nothing: what a request can store without evicting. O(1), as
        # this runs on the engine loop: free minus cached is a lower bound (a cached block in use
        # is not free), exact for a fresh engine and for one whose cache is full.
        cached = len(pool.cached_block_hash_to_block._cache)
        out["kv_empty_blocks"] = max(0, out["kv_free_blocks"] - cached)
    except AttributeError:
        pass
    fit = core.__dict__.get("_baton_fit")
    rates = fit.rates() if fit is not None else None
    if rates is not None and rates.steps >= MIN_FIT_STEPS:
        out.update(prefill_s_per_token=rates.compute_s_per_token, load_s_per_token=rates.load_s_per_token,
                   step_s=rates.base_s, fit_steps=rates.steps)
    return out


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
