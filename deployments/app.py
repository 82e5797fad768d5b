"""Builds the Serve application graph from the config.

Each pool is its own deployment of `EngineReplica` with its own replica count
and Ray resources, so on a cluster its replicas land on the node types that
advertise those resources. There is no Serve HTTP proxy and no ingress
deployment: decode replicas serve the public port themselves
(deployments/front/front.py). The decode pool is the application's root; the
prefill pool and the KV indexer are bound to it only so that Serve deploys
them with it.
"""

from __future__ import annotations

from pathlib import Path

from ray import serve
from ray.serve import Application

from actors.vllm_plugin import FIT_ENV, FORK_ENV, SPIN_ENV
from common.engine_threads import THREAD_KEYS
from common.config import BatonConfig, PoolConfig
from deployments.kv_index.kv_indexer import KVIndexer
from deployments.replica import EngineReplica
from deployments.catalogue.runtime_envs import with_uploaded_envs


def _engine_env(cfg: BatonConfig, mooncake_config: Path | None) -> dict[str, str]:
    """Where an engine finds the Mooncake store, and how long one of its transfers may take."""
    if not mooncake_config:
        return {}
    timeout = str(cfg.mooncake.transfer_timeout_s)
    # Over TCP, the store client's bounds are a transfer's status frame and its payload's progress
    # (30 s each by default); MC_TRANSFER_TIMEOUT is the transfer engine's own.
    return {"MOONCAKE_CONFIG_PATH": str(mooncake_config), "MC_TCP_STATUS_TIMEOUT_SEC": timeout,
            "MC_TCP_PROGRESS_TIMEOUT_SEC": timeout, "MC_TRANSFER_TIMEOUT": timeout}


# The spin cap when `{pool}.shm_spin_s` is null. Alone on its cores, an engine's reader
# spins through a whole step under load (a step of the tiny CPU model at batch 8 takes
# 3-5 ms; at a 2 ms cap the scheduler slept during every step and woke late, 0.76-0.92x
# `vllm serve` at c8) and sleeps only in idle gaps. Where several engines share the cores
# (the launcher's thread split), a spinning reader takes the other engines' CPU: 2 ms.
SPIN_ALONE_S, SPIN_SHARED_S = 0.1, 0.002
# How often Serve asks a replica whether it is healthy (`EngineReplica.check_health`): a replica
# whose engine died forwards its requests meanwhile (replica.py `_watch_engine`), so this bounds how
# long the pool runs an engine short; Serve replaces it after three failed checks in a row. Serve's
# default, 10 s, left it short 34 s (`baton bench chaos`); 2 s, 21-23 s. 1 s (tried in CI run67)
# saved 2 s there, while the e2e tests that kill an engine ran 10-30 s longer each (a replacement
# starts while the test still runs); the VM slowed that day too, so no gain was shown: kept at 2.
HEALTH_CHECK_S = 2


def _plugin_env(pool: PoolConfig, split: dict[str, str]) -> dict[str, str]:
    """Settings for Baton's vLLM plugin in this pool's engine processes: the spin cap (`split`: the
    launcher's thread split, when engines share this machine's cores), the step timing that measures
    the engine's rates for routing, and whether the engine core forks its worker: only where the
    engine's OpenMP threads are unbound (the split, or the pool's own "nobind"), since a forked
    worker keeps the OpenMP settings its engine core loaded and vLLM's binding is set per worker."""
    spin = pool.shm_spin_s if pool.shm_spin_s is not None else SPIN_SHARED_S if split else SPIN_ALONE_S
    env = {FIT_ENV: "1", SPIN_ENV: str(spin)}
    if not pool.resources.num_gpus and {**split, **pool.env}.get("VLLM_CPU_OMP_THREADS_BIND") == "nobind":
        env[FORK_ENV] = "1"
    return env


def _threads(pool: PoolConfig, threads: dict[str, str]) -> dict[str, str]:
    """The launcher's thread split, for CPU engines whose pool sets no threads of its own."""
    return {} if pool.resources.num_gpus or THREAD_KEYS & pool.env.keys() else threads


def _pool(cfg: BatonConfig, role: str, pool: PoolConfig, mooncake_config: Path | None, env: dict[str, str],
          threads: dict[str, str], *bound):
    options = pool.resources.ray_actor_options()
    split = _threads(pool, threads)
    options["runtime_env"] = {"env_vars": {**_engine_env(cfg, mooncake_config), **env, **split,
                                           **_plugin_env(pool, split), **pool.env}}
    name = "decode" if role == "colocated" else role
    return serve.deployment(EngineReplica).options(
        name=name,
        num_replicas=pool.replicas,
        ray_actor_options=options,
        max_ongoing_requests=pool.max_ongoing_requests,
        health_check_period_s=HEALTH_CHECK_S,
        health_check_timeout_s=30,
        # No Serve request reaches a replica (its traffic is HTTP on its own ports), so Serve's drain,
        # which waits this long for requests on their way before it counts ongoing ones, waits for
        # nothing; the replica drains its HTTP requests itself (deployments/replica.py DRAIN_S, 10 s).
        graceful_shutdown_wait_loop_s=0.1,
        graceful_shutdown_timeout_s=15,
    ).bind(cfg.model_dump(), role, *bound)


def build_app(cfg: BatonConfig, mooncake_config: Path | None, env: dict[str, str] | None = None,
              threads: dict[str, str] | None = None) -> Application:
    """The bound application; `mooncake_config` is the workers' JSON file, `env` the environment of
    every replica, `threads` that of CPU engines (common/engine_threads.py) whose pool sets none."""
    env, threads = env or {}, threads or {}
    cfg = with_uploaded_envs(cfg)  # catalogue models' local py_modules / working_dir, as ray.init uploads them
    if cfg.colocated and not cfg.routes():
        return _pool(cfg, "colocated", cfg.decode, None, env, threads)
    # Its Serve replica runs a gRPC server of Ray's that binds a wildcard, as the engines' do.
    indexer = KVIndexer.options(ray_actor_options={"num_cpus": 0, "runtime_env": {"env_vars": env}})
    indexer = indexer.bind(cfg.model_dump())
    if cfg.colocated:  # routed colocated: the fronts route among the pool's replicas
        return _pool(cfg, "colocated", cfg.decode, mooncake_config if cfg.mooncake.colocated_pool else None,
                     env, threads, indexer)
    prefill = _pool(cfg, "prefill", cfg.prefill, mooncake_config, env, threads)
    return _pool(cfg, "decode", cfg.decode, mooncake_config, env, threads, prefill, indexer)
