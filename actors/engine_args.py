"""Turns a pool's config into vLLM engine arguments for one role.

Roles: `prefill` writes KV into Mooncake (kv_producer), `decode` reads it
(kv_consumer), both through BatonStoreConnector (kvstore/connector.py), and
`colocated` is a plain engine with no connector, or, routed with
`mooncake.colocated_pool`, one that does both (kv_both): it saves what it
computes and loads prefixes other replicas saved. An engine on the timed
executor (actors/sim) gets that executor's own connector instead.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import itertools
import os
from pathlib import Path
from typing import Any, Literal

from actors import step_budget
from actors.sim import CONNECTOR, CONNECTOR_MODULE, EXECUTOR
from common.config import BatonConfig, ConfigError, parse_size
from common.config.models import check_budgets
from common.listeners import is_loopback

Role = Literal["prefill", "decode", "colocated"]
_KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
# Set by Baton itself; a pool's engine_args may not override them.
_OWNED = {"model", "served_model_name", "dtype", "block_size", "max_model_len", "kv_transfer_config",
          "speculative_config"}


def engine_kwargs(cfg: BatonConfig, role: Role, step_tokens: int | None = None, gpu: bool = False) -> dict[str, Any]:
    """The AsyncEngineArgs keyword arguments for `role` (no vLLM import). `step_tokens`: a scheduler
    step's prompt-token budget (actors/step_budget.py, CPU only), unless the pool's engine_args set one.
    `gpu`: the engine runs on a CUDA GPU (speculation picks its GPU form)."""
    pool = cfg.prefill if role == "prefill" else cfg.decode
    kwargs: dict[str, Any] = {
        "model": str(cfg.model.resolved_path()),
        "served_model_name": cfg.model.served_name,
        "dtype": cfg.model.dtype,
        "block_size": cfg.model.block_size,
        "max_model_len": cfg.model.max_model_len,
        "enable_prefix_caching": True,
        "enforce_eager": True,
        # vLLM's engine series on /metrics, as `vllm serve` has them (serve.engine_metrics)
        "disable_log_stats": not (gpu if cfg.serve.engine_metrics is None else cfg.serve.engine_metrics),
        # A grammar that allows free whitespace lets a peaked small model pad a forced tool
        # call's arguments with it until max_tokens; JSON without it is still JSON.
        "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
    }
    if pool.kv_cache_gb is not None:
        # A fixed size also skips the CPU backend's check that 92% of the
        # node's memory is free, which fails with several engines per node.
        kwargs["kv_cache_memory_bytes"] = int(pool.kv_cache_gb * 2**30)
    if pool.speculation is not None and role != "prefill":  # prefill computes one token: nothing to speculate
        kwargs["speculative_config"] = pool.speculation.vllm(gpu)
        kwargs["disable_log_stats"] = False  # the acceptance counts come with the engine's stats
    if step_tokens:
        kwargs["max_num_batched_tokens"] = step_tokens
    kwargs.update(pool.engine_args)
    kv_role = _KV_ROLE.get(role)
    if role == "colocated" and cfg.mooncake.colocated_pool and cfg.routes():
        kv_role = "kv_both"
    if kv_role:
        timed = kwargs.get("distributed_executor_backend") == EXECUTOR  # a modelled GPU: its own connector
        kwargs["kv_transfer_config"] = {
            "kv_connector": CONNECTOR if timed else "BatonStoreConnector",
            "kv_connector_module_path": CONNECTOR_MODULE if timed else "kvstore.connector",
            "kv_role": kv_role,
            # A block the store announced and then could not deliver (evicted
            # between lookup and load, a corrupted spill file) is recomputed,
            # not an error for the request (vLLM's default is "fail").
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {**connector_extra(cfg), "lookup_rpc_port": _lookup_id()},
        }
        if role == "prefill" and not cfg.mooncake.prefix_reuse:
            kwargs["kv_transfer_config"]["kv_connector_extra_config"]["enable_lookup"] = False
    return kwargs


_engines_here = itertools.count()


def _lookup_id() -> int:
    """A number no other engine on this machine uses. vLLM's Mooncake store names the
    IPC socket between its scheduler and worker after this number and the host name
    only (/tmp/lookup_rpc_port_<n>_host_<host>_dp_rank0), so engines sharing a machine
    with the default 0 race for one socket file, and one of them can fail to start."""
    return int(f"{os.getpid()}{next(_engines_here):03d}")


def connector_extra(cfg: BatonConfig) -> dict[str, Any]:
    """kv_connector_extra_config for BatonStoreConnector: the holdings audit and the spill tier, if on."""
    m = cfg.mooncake
    host = f"[{m.host}]" if ":" in m.host else m.host
    extra: dict[str, Any] = {"baton_audit_s": m.holdings_audit_s,
                             "baton_master_http": f"http://{host}:{m.master_metrics_port}"}
    if m.shm_reads and is_loopback(m.host):
        # The store listens on loopback, so it runs on this host: its real-client service shares memory.
        extra["baton_shm_store"] = {"address": f"{host}:{m.store_port}", "staging_bytes": parse_size(m.shm_staging)}
    if m.spill:
        extra["baton_spill"] = {
            "dir": str(cfg.spill_path()),
            "cap_bytes": parse_size(m.spill_cap),
            "min_free_bytes": parse_size(m.spill_min_free),
        }
    return extra


def engine_arg_names() -> set[str]:
    """The field names of vLLM's AsyncEngineArgs, read from vLLM's source without importing it.

    Importing vLLM costs 10-20 CPU-seconds here, which every `baton up` paid before it started
    anything. Falls back to the import where the source does not declare the two dataclasses."""
    spec = importlib.util.find_spec("vllm")  # a top-level package: found, not imported
    roots = (spec.submodule_search_locations or []) if spec else []
    source = Path(roots[0]) / "engine" / "arg_utils.py" if roots else None
    names: set[str] = set()
    classes = set()
    if source is not None and source.exists():
        for node in ast.parse(source.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name in ("EngineArgs", "AsyncEngineArgs"):
                classes.add(node.name)
                names |= {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)
                          and isinstance(s.target, ast.Name) and "ClassVar" not in ast.unparse(s.annotation)}
    if classes == {"EngineArgs", "AsyncEngineArgs"} and names:
        return names
    from vllm.engine.arg_utils import AsyncEngineArgs

    return {f.name for f in dataclasses.fields(AsyncEngineArgs)}


def validate(cfg: BatonConfig, source: str) -> None:
    """Checks every pool's engine_args names against vLLM's AsyncEngineArgs.

    Raises ConfigError naming the field and the file; changes nothing.
    """
    named = [*cfg.prefill.engine_args, *cfg.decode.engine_args, *(k for m in cfg.models for k in m.engine_args)]
    known = engine_arg_names() if named else set()
    for pool_name in ("prefill", "decode"):
        for key in getattr(cfg, pool_name).engine_args:
            field = f"{pool_name}.engine_args.{key}"
            if key in _OWNED:
                raise ConfigError(f"invalid config in {source}:\n  {field}: set by Baton from `model` "
                                  f"or `speculation`; remove it")
            if key not in known:
                raise ConfigError(f"invalid config in {source}:\n  {field}: not a vLLM engine argument")
    for pool_name in ("prefill", "decode"):
        spec = getattr(cfg, pool_name).speculation
        if spec is not None and (why := spec.missing_draft()):
            raise ConfigError(f"invalid config in {source}:\n  {pool_name}.speculation.draft_model: {why}")
    check_budgets(cfg, source)
    for i, entry in enumerate(cfg.models):
        for key in entry.engine_args:
            field = f"models.{i}.engine_args.{key}"
            if key in _OWNED or key not in known:
                why = "set by Baton from the entry" if key in _OWNED else "not a vLLM engine argument"
                raise ConfigError(f"invalid config in {source}:\n  {field}: {why}")


def seqs_limit(vllm_config) -> int | None:
    """The engine's max_num_seqs where admission should admit up to it: on a GPU, or on the timed
    executor (actors/sim: the profiled GPU's); None for a CPU engine (common/config/admission.py)."""
    from vllm.platforms import current_platform

    from actors.sim.timed_executor import profiled_seqs

    timed = profiled_seqs(vllm_config)
    if timed is not None:
        return timed
    return vllm_config.scheduler_config.max_num_seqs if current_platform.is_cuda() else None


def build(cfg: BatonConfig, role: Role, topic: str | None = None, replay_endpoint: str | None = None):
    """A vLLM AsyncEngineArgs for `role`.

    With a `topic` (the replica id), the engine publishes its KV events to
    the KV indexer's socket under that topic. A non-wildcard endpoint makes
    vLLM's publisher connect rather than bind, so one indexer receives from
    every engine, wherever it runs. `replay_endpoint` (an explicit
    tcp://host:port) is where the publisher answers replay requests from its
    buffer of past batches, for an indexer that missed some.
    """
    from vllm.config import KVEventsConfig, KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform

    step, pool = None, cfg.prefill if role == "prefill" else cfg.decode
    if current_platform.is_cpu() and "max_num_batched_tokens" not in pool.engine_args:
        step = step_budget.cpu_step_tokens(cfg.model.resolved_path(), pool.engine_args.get("max_num_seqs", 0))
    kwargs = engine_kwargs(cfg, role, step, current_platform.is_cuda())
    if "kv_transfer_config" in kwargs:
        kwargs["kv_transfer_config"] = KVTransferConfig(**kwargs["kv_transfer_config"])
    if isinstance(kwargs.get("structured_outputs_config"), dict):
        from vllm.config import StructuredOutputsConfig

        kwargs["structured_outputs_config"] = StructuredOutputsConfig(**kwargs["structured_outputs_config"])
    if topic:
        r = cfg.routing
        kwargs["kv_events_config"] = KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq",
            endpoint=f"tcp://{r.events_host}:{r.events_port}", topic=topic, replay_endpoint=replay_endpoint)
    return AsyncEngineArgs(**kwargs)
