"""Mooncake processes and the workers' Mooncake config.

kvstore/ owns Mooncake: this module turns `MooncakeConfig` into the master
process (with its HTTP metadata server), the standalone store process that
owns the memory pool (and, with offload on, the NVMe tier), and the JSON file
that vLLM's MooncakeStoreConnector reads through MOONCAKE_CONFIG_PATH.

Workers run in `standalone-store` mode: they contribute no memory, so the KV
pool outlives any engine that wrote into it.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from common.config import MooncakeConfig
from common.processes import ManagedProcess


def _binary(name: str) -> str:
    """The Mooncake binary shipped in the venv's bin next to this Python."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found; install mooncake-transfer-engine(-non-cuda)")
    return found


def master_process(cfg: MooncakeConfig, log_dir: Path) -> ManagedProcess:
    argv = [
        _binary("mooncake_master"),
        f"--rpc_port={cfg.master_port}",
        f"--rpc_address={cfg.host}",
        "--enable_http_metadata_server=true",
        f"--http_metadata_server_host={cfg.host}",
        f"--http_metadata_server_port={cfg.metadata_port}",
        f"--metrics_host={cfg.host}",
        f"--metrics_port={cfg.master_metrics_port}",
        f"--enable_offload={'true' if cfg.enable_offload else 'false'}",
        f"--default_kv_lease_ttl={cfg.kv_lease_ttl_ms}",
        f"--client_ttl={cfg.client_ttl_s}",
        f"--rpc_thread_num={cfg.master_rpc_threads}",
        "--logtostderr",
    ]
    return ManagedProcess(
        "mooncake-master", argv, log_dir / "mooncake-master.log",
        ready_port=(cfg.host, cfg.master_port),
    )


def store_process(cfg: MooncakeConfig, log_dir: Path) -> ManagedProcess:
    argv = [
        _binary("mooncake_client"),
        f"--master_server_address={cfg.host}:{cfg.master_port}",
        f"--metadata_server={metadata_url(cfg)}",
        f"--global_segment_size={cfg.global_segment_size}",
        f"--host={cfg.host}",
        f"--port={cfg.store_port}",
        f"--protocol={cfg.protocol}",
        f"--enable_offload={'true' if cfg.enable_offload else 'false'}",
        "--enable_http_server=true",
        f"--http_port={cfg.store_http_port}",
        "--logtostderr",
    ]
    if cfg.device_name:
        argv.append(f"--device_names={cfg.device_name}")
    env = {}
    if cfg.enable_offload:
        if not cfg.offload_dir:
            raise ValueError("mooncake.offload_dir is required when mooncake.enable_offload is true")
        Path(cfg.offload_dir).mkdir(parents=True, exist_ok=True)
        env["MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"] = str(Path(cfg.offload_dir).resolve())
    return ManagedProcess(
        "mooncake-store", argv, log_dir / "mooncake-store.log",
        ready_port=(cfg.host, cfg.store_port), env=env,
    )


def metadata_url(cfg: MooncakeConfig) -> str:
    return f"http://{cfg.host}:{cfg.metadata_port}/metadata"


def worker_config(cfg: MooncakeConfig) -> dict:
    """The dict vLLM's MooncakeStoreConfig.from_file expects."""
    return {
        "metadata_server": metadata_url(cfg),
        "master_server_address": f"{cfg.host}:{cfg.master_port}",
        "protocol": cfg.protocol,
        "device_name": cfg.device_name,
        "mode": "standalone-store",
        "global_segment_size": 0,
        "local_buffer_size": cfg.local_buffer_size,
        "enable_offload": cfg.enable_offload,
    }


def write_worker_config(cfg: MooncakeConfig, path: Path) -> Path:
    """Writes the workers' Mooncake JSON to `path` (overwriting) and returns it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(worker_config(cfg), indent=2))
    return path
