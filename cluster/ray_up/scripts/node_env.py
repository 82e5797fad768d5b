"""Prints the Baton config's ports and Mooncake settings as shell exports.

Used by common.sh (`eval "$(python node_env.py --config FILE --head-ip IP)"`)
so that the node scripts read the same config as `baton deploy`. With
`--worker-json PATH` it also writes the workers' Mooncake JSON there, through
kvstore.mooncake.write_worker_config, with loopback hosts replaced by the
head's IP exactly as cluster/deploy.py does.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from common.config import ConfigError, load_config  # noqa: E402
from cluster.deploy import localize  # noqa: E402
from kvstore.mooncake import write_worker_config  # noqa: E402


def exports(cfg) -> dict[str, str]:
    m = cfg.mooncake
    redis = urlparse(cfg.redis.url)
    return {
        "BATON_REDIS_HOST": redis.hostname or "127.0.0.1",
        "BATON_REDIS_PORT": str(redis.port or 6379),
        "BATON_REDIS_START": "true" if cfg.redis.start_local else "false",
        "BATON_REDIS_APPENDFSYNC": cfg.redis.appendfsync,
        "BATON_REDIS_PASSWORD_FILE": str(Path(cfg.redis.password_file).expanduser()) if cfg.redis.password_file else "",
        "BATON_SERVE_PORT": str(cfg.serve.port),
        "BATON_EVENTS_PORT": str(cfg.routing.events_port),
        "MOONCAKE_MASTER_PORT": str(m.master_port),
        "MOONCAKE_METADATA_PORT": str(m.metadata_port),
        "MOONCAKE_MASTER_METRICS_PORT": str(m.master_metrics_port),
        "MOONCAKE_STORE_PORT": str(m.store_port),
        "MOONCAKE_STORE_HTTP_PORT": str(m.store_http_port),
        "MOONCAKE_GLOBAL_SEGMENT_SIZE": m.global_segment_size,
        "MOONCAKE_PROTOCOL": m.protocol,
        "MOONCAKE_DEVICE_NAME": m.device_name,
        "MOONCAKE_ENABLE_OFFLOAD": "true" if m.enable_offload else "false",
        "MOONCAKE_OFFLOAD_DIR": m.offload_dir or "",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", help="Baton config YAML (default: built-in defaults)")
    p.add_argument("--head-ip", required=True, help="the head's IP, for loopback hosts in the config")
    p.add_argument("--worker-json", help="also write the workers' Mooncake JSON to this path")
    args = p.parse_args(argv)
    try:
        cfg, _ = localize(load_config(args.config), args.head_ip)
    except ConfigError as exc:
        print(f"node_env: {exc}", file=sys.stderr)
        return 2
    if args.worker_json:
        write_worker_config(cfg.mooncake, Path(args.worker_json))
    for key, value in exports(cfg).items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
