"""Builds the Serve application graph from the config.

ingress -> prefill pool -> decode pool, each pool its own deployment with its
own replica count and Ray resources, so on a cluster they land on the node
types that advertise those resources.
"""

from __future__ import annotations

from pathlib import Path

from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from actors.engine_server import EngineServer
from common.config import BatonConfig, PoolConfig
from deployments import replica_router
from deployments.ingress import Ingress
from deployments.kv_indexer import KVIndexer


def _engine_env(mooncake_config: Path | None) -> dict[str, str]:
    return {"MOONCAKE_CONFIG_PATH": str(mooncake_config)} if mooncake_config else {}


def _pool(cfg: BatonConfig, role: str, pool: PoolConfig, mooncake_config: Path | None):
    options = pool.resources.ray_actor_options()
    options["runtime_env"] = {"env_vars": _engine_env(mooncake_config)}
    name = "decode" if role == "colocated" else role
    return serve.deployment(EngineServer).options(
        name=name,
        request_router_config=RequestRouterConfig(request_router_class=replica_router.PATH),
        num_replicas=pool.replicas,
        ray_actor_options=options,
        max_ongoing_requests=pool.max_ongoing_requests,
        health_check_period_s=10,
        health_check_timeout_s=30,
        graceful_shutdown_timeout_s=5,
    ).bind(cfg.model_dump(), role)


def build_app(cfg: BatonConfig, mooncake_config: Path | None) -> Application:
    """The bound application; `mooncake_config` is the workers' JSON file."""
    if cfg.colocated:
        prefill = None
        decode = _pool(cfg, "colocated", cfg.decode, None)
    else:
        prefill = _pool(cfg, "prefill", cfg.prefill, mooncake_config)
        decode = _pool(cfg, "decode", cfg.decode, mooncake_config)
    indexer = None if cfg.colocated else KVIndexer.bind(cfg.model_dump())
    return Ingress.bind(cfg.model_dump(), prefill, decode, indexer)
