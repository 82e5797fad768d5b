"""Baton's one declarative config: a pydantic model loaded from YAML plus env.
The package: `BatonConfig` and `load_config` here; its sections in base (shared
types, ConfigError), admission, autoscale, batch, models, redis_store, runtime, sites, spec.

Every component reads its part of `BatonConfig`. Unknown keys are errors
(`extra="forbid"`); any problem is one `ConfigError` naming field and file.

Env overrides: `BATON__` and `__` between levels (`BATON__SERVE__PORT=8001`,
`BATON__DECODE__REPLICAS=2`), parsed as YAML scalars (`true`, `2`, `0.5` keep types).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from common.config.admission import AdmissionConfig
from common.config.autoscale import AutoscalingSection
from common.config.base import ConfigError, _Strict, parse_size
from common.config.models import CatalogueConfig, CatalogueModel, check_catalogue
from common.config.batch import BatchConfig, ResponsesConfig
from common.config.redis_store import RedisConfig
from common.config.runtime import RayConfig, TracingConfig
from common.config.sites import SitesConfig
from common.config.spec import SpeculationConfig
from common.constants import DEFAULT_MODEL_DIR, REPO_ROOT

__all__ = ["AdmissionConfig", "BatonConfig", "ConfigError", "load_config", "parse_size"]
ENV_PREFIX = "BATON__"


class ModelConfig(_Strict):
    path: str | None = Field(
        None, description="HF-format checkpoint directory; None generates the tiny default model"
    )
    served_name: str = Field("baton-tiny", description="model id clients send in `model`")
    max_model_len: int = Field(2048, gt=0, description="context length, prompt plus output")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "float32", description="weights and KV dtype passed to vLLM"
    )
    block_size: int = Field(32, gt=0, description="KV block size in tokens, same on every engine")
    tool_call_parser: str | None = Field(
        "pythonic", description="vLLM tool-call parser for `tools` (e.g. pythonic, llama3_json, hermes); "
        "null turns tool calling off",
    )

    def resolved_path(self) -> Path:
        return Path(self.path).expanduser().resolve() if self.path else DEFAULT_MODEL_DIR


class ReplicaResources(_Strict):
    num_cpus: float = Field(0, ge=0, description="Ray CPUs reserved per replica")
    num_gpus: float = Field(0, ge=0, description="Ray GPUs per replica")
    accelerator_type: str | None = Field(None, description="Ray accelerator type, e.g. H100 or L4")
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources, e.g. {prefill: 1}"
    )
    cpu_quota: float | None = Field(
        None, gt=0, description="cores of CPU time each replica may use, engine included (a cgroup quota: "
        "common/cpu_slice.py; needs root or a delegated cgroup); null: no cap")

    def ray_actor_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.accelerator_type:
            opts["accelerator_type"] = self.accelerator_type
        if self.resources:
            opts["resources"] = dict(self.resources)
        return opts


class PoolConfig(_Strict):
    replicas: int = Field(1, ge=1, description="number of engine replicas in this pool")
    resources: ReplicaResources = Field(default_factory=ReplicaResources)
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="extra vLLM AsyncEngineArgs for this pool's engines"
    )
    kv_cache_gb: float | None = Field(
        1.0, gt=0,
        description="KV cache per engine in GiB; null sizes it from gpu_memory_utilization",
    )
    max_ongoing_requests: int = Field(64, ge=1, description="Serve concurrency cap per replica")
    start_timeout_s: float = Field(
        900, gt=0,
        description="a replica whose engine is not serving this long after it started fails, and Serve "
        "starts another in its place (an engine start that hangs is retried, not waited on forever)",
    )
    shm_spin_s: float | None = Field(
        None, ge=0, description="how long an engine's worker and scheduler spin on vLLM's shared-memory "
        "queue after a message before they sleep (actors/vllm_plugin.py; vLLM's own: 1 s); null: 0.1 s, "
        "or 2 ms where the launcher splits one machine's cores between several engines",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="environment of this pool's engine processes, e.g. {VLLM_CPU_OMP_THREADS_BIND: '0'} "
        "to pin a CPU engine's threads to core 0 (without either OpenMP setting here, `baton up` gives each of "
        "several CPU engines cores // engines unbound threads: common/engine_threads.py)",
    )
    autoscaling: AutoscalingSection | None = Field(
        None, description="per-pool autoscaling (used by `baton deploy`); null keeps `replicas` fixed"
    )
    speculation: SpeculationConfig | None = Field(
        None, description="speculative decoding in this pool's engines (common/config/spec.py); null: none"
    )


class MooncakeConfig(_Strict):
    host: str = Field("127.0.0.1", description="address the master and store bind and advertise")
    master_port: int = Field(50051, gt=0, lt=65536, description="master RPC port")
    metadata_port: int = Field(8090, gt=0, lt=65536, description="HTTP metadata server port")
    master_metrics_port: int = Field(9003, gt=0, lt=65536, description="master metrics port")
    store_port: int = Field(50052, gt=0, lt=65536, description="store (real client) service port")
    store_http_port: int = Field(9300, gt=0, lt=65536, description="store health/metrics port")
    global_segment_size: str = Field("512MB", description="memory pool the store contributes")
    local_buffer_size: str = Field("128MB", description="per-worker transfer buffer")
    protocol: Literal["tcp", "rdma"] = Field("tcp", description="transfer protocol")
    device_name: str = Field("", description="RDMA device names, empty for tcp")
    enable_offload: bool = Field(
        False, description="Mooncake's own SSD offload flags (wrote nothing in 0.3.13); Baton spills itself"
    )
    offload_dir: str | None = Field(None, description="directory for Mooncake's own offload")
    kv_lease_ttl_ms: int = Field(
        10000, gt=0, description="how long a read keeps an object from eviction in the memory pool"
    )
    client_ttl_s: int = Field(
        3, gt=0, description="how long the master keeps a silent client's segments mounted: while a dead "
        "store's segment stays mounted every put into it fails after ~750 ms, which stalls prefill's saves "
        "(at Mooncake's default of 10 s a store kill stalled them 10 s and 6-12 requests failed; at 3 s "
        "goodput was back in 2.75 s, none failed: docs/bench_chaos.md). A live store "
        "pings it well within 2 s even with six busy loops on 2 cores; one that misses it loses its pool "
        "(objects recomputed), not its place (it mounts again)"
    )
    transfer_timeout_s: int = Field(
        5, gt=0, description="the engines' Mooncake transfer timeouts (MC_TCP_STATUS_TIMEOUT_SEC, "
        "MC_TCP_PROGRESS_TIMEOUT_SEC, MC_TRANSFER_TIMEOUT; Mooncake's default 30 s): a load from a stopped "
        "store fails after it and the request recomputes its KV (kv_load_failure_policy), where at 30 s "
        "a 40 s store freeze hung 2 of 678 requests past the client's 30 s deadline (docs/bench_chaos.md). "
        "A put or get that moves more than this allows at the link's speed needs more"
    )
    master_rpc_threads: int = Field(
        8, gt=0, description="master RPC threads (Mooncake's default is one per core: two on a 2-core node)"
    )
    spill: bool = Field(True, description="Baton's NVMe spill tier behind the memory pool")
    spill_dir: str | None = Field(
        None, description="spill tier directory (put it on NVMe); null: <state_dir>/kv-spill"
    )
    spill_cap: str = Field("16GB", description="size cap of the spill directory, LRU eviction beyond it")
    spill_min_free: str = Field("1GB", description="spilling pauses while the disk has less free space")
    prefix_reuse: bool = Field(
        True, description="prefill engines load prompt prefixes other engines saved in the pool; "
        "false: the pool only carries each prompt's KV from prefill to decode"
    )
    holdings_audit_s: float = Field(
        1.0, gt=0, description="how often a prefill worker checks that the store still holds what it put"
    )
    shm_reads: bool = Field(
        True, description="CPU engines read the pool through shared memory with the store process "
        "(Mooncake's dummy client) when the store listens on loopback, i.e. runs on their host; other "
        "reads use the transfer engine (`protocol`)"
    )
    shm_staging: str = Field("128MB", description="shared staging area per engine worker for those reads")
    colocated_pool: bool = Field(
        False, description="routed colocated replicas (routing.colocated_router) save the KV they compute "
        "into the pool and the spill tier, and load prompt prefixes other replicas saved; false: each "
        "reuses only its own cache"
    )

    @field_validator("spill_cap", "spill_min_free", "shm_staging")
    @classmethod
    def _size(cls, v: str) -> str:
        parse_size(v)
        return v


class ServeConfig(_Strict):
    host: str = Field("127.0.0.1", description="HTTP bind address of the endpoint")
    port: int = Field(8000, gt=0, lt=65536, description="HTTP port of the endpoint")
    ingress: Literal["auto", "direct", "haproxy"] = Field(
        "auto", description="direct: each decode replica serves `host:port` itself (SO_REUSEPORT); haproxy: "
        "`baton up` runs HAProxy there, which runs a request again on another replica when the one it reached "
        "dies before answering a byte (cluster/ingress.py); auto: haproxy under `baton up` on its own Ray, "
        "direct under `baton deploy` and on a Ray cluster (`ray.address`)")
    front_port: int = Field(0, ge=0, lt=65536, description="with ingress haproxy: the loopback port the "
                            "replicas' fronts share behind it; 0: a free one, picked at `baton up`")
    internal_host: str = Field(
        "127.0.0.1", description="address engine replicas bind their internal server on (other "
        "replicas forward to it); `auto`: the node's IP as Ray knows it, for clusters (firewall it, "
        "docs/security.md)",
    )
    request_timeout_s: float = Field(300, gt=0, description="hard deadline for one request")
    engine_metrics: bool | None = Field(
        None, description="vLLM's own engine series (`vllm:*`) on /metrics, per replica; null: on with GPU "
        "engines (as `vllm serve` has them), off on CPU engines, whose tiny steps the per-step stats are a "
        "share of (docs/bench_serve.md)")
    request_metrics: bool = Field(False, description="answers carry vLLM's per-request timing (`metrics`), as "
                                  "`vllm serve --enable-per-request-metrics`; needs engine_metrics on")
    require_api_key: bool = Field(False, description="answer 401 to requests without a valid API key (on in the ray "
                                  "up YAMLs)")
    api_keys: dict[str, str] = Field(
        default_factory=dict,
        description="`sha256:<hex>` hash of an API key -> its tenant (`baton keys hash KEY` prints it); "
        "`baton keys add` keeps keys in Redis instead, added and revoked without a restart",
    )
    anonymous_tenant: str = Field("default", min_length=1, description="tenant of requests without a key, when "
                                  "keys are not required")
    max_body_bytes: int = Field(16 * 2**20, gt=0, description="larger request bodies get a 413")

    def front_bind(self) -> tuple[str, int]:
        """Where the decode replicas' fronts listen: the public address, or loopback behind HAProxy."""
        return ("127.0.0.1", self.front_port) if self.ingress == "haproxy" else (self.host, self.port)

    @field_validator("api_keys")
    @classmethod
    def _hashed_keys(cls, v: dict[str, str]) -> dict[str, str]:
        for key, tenant in v.items():
            if not re.fullmatch(r"sha256:[0-9a-f]{64}", key):
                raise ValueError("keys are stored hashed: put what `baton keys hash <key>` prints there, "
                                 "never the key itself")
            if not tenant:
                raise ValueError(f"{key[:15]}...: empty tenant")  # the hash's prefix only
        return v


class RoutingConfig(_Strict):
    policy: Literal["baton", "round_robin", "least_loaded"] = Field(
        "baton", description="baton: session pins + exact prefix index + load; round_robin and "
        "least_loaded (fewest requests this front has in flight there): for comparisons"
    )
    pin_ttl_s: float = Field(600, gt=0, description="session pin lifetime in Redis, refreshed on use")
    decode_only_max_uncached_tokens: int = Field(
        64, ge=0, description="run decode-only when the decode replica lacks fewer prompt tokens than this"
    )
    events_host: str = Field(
        "127.0.0.1", description="address the KV indexer binds; engines publish KV events to it"
    )
    events_port: int = Field(5557, gt=0, lt=65536, description="port the KV indexer binds")
    heartbeat_s: float = Field(2.0, gt=0, description="engine replicas refresh their registry entry this often")
    replica_timeout_s: float = Field(
        6.0, gt=0, description="a replica whose heartbeat is older than this is treated as dead"
    )
    seed: int = Field(0, description="seed of the policy's power-of-two draws")
    shared_state_ms: float = Field(25, ge=0, description="a front reuses the registry and every front's "
                                   "in-flight counts for this long, refreshed off the request path; 0: read per request")
    local_index: bool = Field(True, description="each front keeps the KV index and the session pins in memory, "
                              "fed through Redis by the indexer and the fronts (deployments/kv_index/index_feed.py, "
                              "deployments/front/pin_feed.py); false: read a request's slice and pins from Redis")
    colocated_router: bool = Field(True, description="colocated with more than one replica (or autoscaling beyond "
        "one): each front sends a request to the replica whose cache holds its longest prefix (engines publish KV "
        "events to the KV indexer); false: a request runs where the kernel put its connection, or on a peer when "
        "that engine is full")
    prefill_first_token: bool = Field(
        True, description="disaggregated: a plain streamed chat request's first token is the one the "
        "prefill engine samples, streamed before the KV moves; decode continues after it "
        "(deployments/front/first_token.py says which requests qualify)"
    )


class BatonConfig(_Strict):
    model: ModelConfig = Field(default_factory=ModelConfig)
    models: list[CatalogueModel] = Field(default_factory=list, description="more models sharing the pool")
    catalogue: CatalogueConfig = Field(default_factory=CatalogueConfig)
    prefill: PoolConfig = Field(default_factory=PoolConfig)
    decode: PoolConfig = Field(default_factory=PoolConfig)
    colocated: bool = Field(
        False, description="decode pool also prefills; no prefill pool, no KV transfer"
    )
    mooncake: MooncakeConfig = Field(default_factory=MooncakeConfig)
    redis: RedisConfig = Field(default_factory=RedisConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    sites: SitesConfig = Field(default_factory=SitesConfig)
    batch: BatchConfig = Field(default_factory=BatchConfig)
    responses: ResponsesConfig = Field(default_factory=ResponsesConfig)
    state_dir: str = Field(".baton", description="pids, logs and worker configs of `up`")

    @model_validator(mode="after")
    def _ports_distinct(self) -> "BatonConfig":
        m = self.mooncake
        ports = {
            "serve.port": self.serve.port,
            **({"serve.front_port": self.serve.front_port} if self.serve.front_port else {}),
            "mooncake.master_port": m.master_port,
            "mooncake.metadata_port": m.metadata_port,
            "mooncake.master_metrics_port": m.master_metrics_port,
            "mooncake.store_port": m.store_port,
            "mooncake.store_http_port": m.store_http_port,
            "routing.events_port": self.routing.events_port,
        }
        seen: dict[int, str] = {}
        for name, port in ports.items():
            if port in seen:
                raise ValueError(f"{name} and {seen[port]} both use port {port}")
            seen[port] = name
        return self

    _catalogue = model_validator(mode="after")(check_catalogue)

    @model_validator(mode="after")
    def _batch_tier(self) -> "BatonConfig":
        if self.batch.tier is not None and self.batch.tier not in self.admission.tiers:
            raise ValueError(f"batch.tier {self.batch.tier!r} is not one of admission.tiers {self.admission.tiers}")
        return self

    def batch_tier(self) -> str:
        """The admission tier batch lines run in: `batch.tier`, else the lowest tier."""
        return self.batch.tier or self.admission.tiers[-1]

    def routes(self) -> bool:
        """Whether fronts route requests by the KV-aware router: always when disaggregated; when
        colocated, if `routing.colocated_router` and the pool can have more than one replica."""
        if not self.colocated:
            return True
        d = self.decode
        many = d.replicas > 1 or (d.autoscaling is not None and d.autoscaling.max_replicas > 1)
        return self.routing.colocated_router and many

    def state_path(self) -> Path:
        p = Path(self.state_dir)
        return p if p.is_absolute() else REPO_ROOT / p

    def spill_path(self) -> Path:
        """Directory of the NVMe spill tier (mooncake.spill_dir or <state_dir>/kv-spill)."""
        d = self.mooncake.spill_dir
        if d is None:
            return self.state_path() / "kv-spill"
        return Path(d) if Path(d).is_absolute() else REPO_ROOT / d


def _apply_env(data: dict[str, Any], environ: dict[str, str]) -> dict[str, Any]:
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in key[len(ENV_PREFIX):].split("__") if p]
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"environment {key}: '{part}' is not a section")
        node[path[-1]] = yaml.safe_load(raw) if raw != "" else None
    return data


def _describe(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  {field}: {e['msg']}")
    return f"invalid config in {source}:\n" + "\n".join(lines)


def load_config(path: str | Path | None = None, environ: dict[str, str] | None = None) -> BatonConfig:
    """Reads YAML (if given), applies BATON__ env overrides and validates.

    Changes nothing on disk. Raises ConfigError naming the field and the file.
    """
    environ = dict(os.environ if environ is None else environ)
    source = str(path) if path else "<defaults>"
    data: dict[str, Any] = {}
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"invalid YAML in {p}: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"invalid config in {p}: top level must be a mapping")
        data = loaded or {}
    if any(k.startswith(ENV_PREFIX) for k in environ):
        source += " (with BATON__ environment overrides)"
    data = _apply_env(data, environ)
    try:
        return BatonConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None
