"""The model catalogue: several models sharing one pool's replicas.

`model:` stays the first model (and the only one when `models:` is empty);
`models:` lists more. Every model in the catalogue has its own engine
process on a replica when it is resident; the catalogue's memory budgets may
add up to more than `catalogue.memory_gb` (overcommit), and only what fits is
resident at once (routing/policy/residency.py decides which; deployments/catalogue/model_host.py
starts and stops the engines).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from common.config.base import _Strict
from common.constants import REPO_ROOT

CATALOGUE_DIR = REPO_ROOT / "models" / "catalogue"
_RUNTIME_ENV_KEYS = {"env_vars", "py_modules", "pip", "uv", "working_dir", "excludes", "config"}
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class GeneratedModel(_Strict):
    size: str = Field("tiny", description="cluster/default_model/tiny_model.py size: tiny, small, medium, wide, deep or bench")
    seed: int = Field(1234, ge=0, description="weights seed; the same seed gives the same bytes everywhere")


class CatalogueModel(_Strict):
    id: str = Field(description="model id clients send in `model`")
    path: str | None = Field(
        None, description="HF-format checkpoint directory; null generates one locally from `generate` "
        "into models/catalogue/<id>")
    generate: GeneratedModel = Field(default_factory=GeneratedModel)
    kv_cache_gb: float = Field(0.25, gt=0, description="KV cache of this model's engine, GiB")
    memory_gb: float | None = Field(
        None, gt=0, description="what the model holds while resident (weights plus KV cache), GiB; "
        "null: its checkpoint's size plus kv_cache_gb")
    engine_args: dict[str, Any] = Field(default_factory=dict,
                                        description="extra vLLM AsyncEngineArgs for this model's engines")
    runtime_env: dict[str, Any] | None = Field(
        None, description="Ray runtime_env of this model's engine (py_modules, pip, env_vars, ...): the model "
        "then runs in its own Ray actor and environment (deployments/catalogue/model_actor.py); null: the replica's")

    @field_validator("runtime_env")
    @classmethod
    def _runtime_env(cls, v: dict | None) -> dict | None:
        if v is not None:
            unknown = set(v) - _RUNTIME_ENV_KEYS
            if unknown:
                raise ValueError(f"unknown runtime_env fields {sorted(unknown)}; use {sorted(_RUNTIME_ENV_KEYS)}")
            if not all(isinstance(x, str) for x in (v.get("env_vars") or {}).values()):
                raise ValueError("runtime_env.env_vars values must be strings")
        return v

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not _ID.match(v):
            raise ValueError("must be 1-128 letters, digits or ._:- and start with a letter or digit")
        return v

    def resolved_path(self) -> Path:
        return Path(self.path).expanduser().resolve() if self.path else CATALOGUE_DIR / self.id

    def budget_bytes(self) -> int:
        """The memory the model is counted for while resident (reads the checkpoint's size)."""
        if self.memory_gb is not None:
            return int(self.memory_gb * 2**30)
        weights = sum(f.stat().st_size for f in self.resolved_path().glob("*.safetensors"))
        return weights + int(self.kv_cache_gb * 2**30)


class CatalogueConfig(_Strict):
    memory_gb: float | None = Field(
        None, gt=0, description="memory each replica gives the catalogue's models, GiB; budgets beyond it "
        "are overcommit (only what fits is resident, the rest wakes on demand); null: all resident")
    min_resident_s: float = Field(
        30, ge=0, description="a woken model stays at least this long before another may evict it "
        "(hysteresis: two models never swap faster than this)")
    demand_half_life_s: float = Field(60, gt=0, description="half-life of the request rate residency weighs")
    sleep_level: int | None = Field(
        None, ge=0, le=2, description="how an evicted model leaves: 1 and 2 put its engine to vLLM's sleep "
        "(1 keeps the weights in host memory, 2 drops them and reloads them from the checkpoint on wake), "
        "0 stops its processes; null: 1 where vLLM's platform has sleep mode (GPUs), else 0")
    standby: bool = Field(
        True, description="keep a process with vLLM's engine modules imported, from which cold engines "
        "fork (actors/fast_start.py): a wake then costs seconds, not a Python start")
    cold_nice: int = Field(
        10, ge=0, le=19, description="CPU engines of resident models outside the hot set (routing/policy/residency.py) "
        "run this much below the replica's priority, so the hot models keep the cores while cold "
        "ones are served (re-ranked as demand moves; needs the right to raise a priority back, else off); "
        "0: every engine at the replica's priority")


def catalogue_models(cfg) -> list[CatalogueModel]:
    """Every model `cfg` (a BatonConfig) serves, `model` first (as a catalogue entry)."""
    first = CatalogueModel(id=cfg.model.served_name, path=str(cfg.model.resolved_path()),
                           kv_cache_gb=cfg.decode.kv_cache_gb or 1.0)
    return [first, *cfg.models]


def for_model(cfg, entry: CatalogueModel, sleep: bool = False):
    """`cfg` (a BatonConfig) as a one-model stack of `entry`: what one engine of the catalogue is built
    from; with `sleep`, its engine is started with vLLM's sleep mode on."""
    extra = {"enable_sleep_mode": True} if sleep else {}
    if entry.id == cfg.model.served_name:
        decode = cfg.decode.model_copy(update={"engine_args": {**cfg.decode.engine_args, **extra}})
        return cfg.model_copy(update={"decode": decode, "models": []})
    model = cfg.model.model_copy(update={"served_name": entry.id, "path": str(entry.resolved_path())})
    decode = cfg.decode.model_copy(update={"kv_cache_gb": entry.kv_cache_gb,
                                           "engine_args": {**cfg.decode.engine_args, **entry.engine_args, **extra}})
    return cfg.model_copy(update={"model": model, "decode": decode, "models": []})


def check_catalogue(cfg):
    """`cfg` (a BatonConfig); raises ValueError if its catalogue repeats an id or runs where fronts route."""
    ids = [cfg.model.served_name] + [m.id for m in cfg.models]
    dup = next((i for i in ids if ids.count(i) > 1), None)
    if dup is not None:
        raise ValueError(f"models: model id {dup!r} appears twice (model.served_name counts)")
    if cfg.models and cfg.routes():
        raise ValueError("models: a catalogue runs on colocated stacks whose fronts serve their own engines "
                         "(colocated: true with one decode replica, or routing.colocated_router: false)")
    return cfg


def check_budgets(cfg, source: str) -> None:
    """Raises ConfigError naming the entry and `source` if one model's budget alone exceeds
    `catalogue.memory_gb` (it could never be resident); reads the checkpoints' sizes."""
    from common.config.base import ConfigError

    if not cfg.models or not cfg.catalogue.memory_gb:
        return
    room = int(cfg.catalogue.memory_gb * 2**30)
    for i, entry in enumerate(catalogue_models(cfg)):
        if entry.budget_bytes() > room:
            field = "model (with decode.kv_cache_gb)" if i == 0 else f"models.{i - 1}"
            raise ConfigError(f"invalid config in {source}:\n  {field}: {entry.id} needs "
                              f"{entry.budget_bytes() / 2**30:.2f} GiB, more than catalogue.memory_gb "
                              f"({cfg.catalogue.memory_gb} GiB) gives all models together")
