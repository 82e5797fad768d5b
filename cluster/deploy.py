"""`baton deploy`: the Baton app onto a Ray cluster that is already running.

The cluster comes from `ray up cluster/ray_up/<provider>.yaml` (see
docs/deploy.md): the head runs Redis and the Mooncake master, every worker a
Mooncake store and a raylet advertising `prefill` or `decode`. This module
connects to it (`ray.init(address=...)`) and calls Serve's deploy
(`serve.run`) with the app graph from `deployments.app.build_app`.

Cluster conventions, shared with cluster/ray_up/scripts/:

- In a cluster config, a loopback host (`mooncake.host`, the host of
  `redis.url`, `routing.events_host`) means "the head": `localize` swaps in
  the head's IP, and the node scripts do the same when they start Redis, the
  master and the stores.
- The workers' Mooncake JSON lives at the same path on every node
  (`$BATON_NODE_DIR/mooncake.json`, /tmp/baton/mooncake.json by default).
  worker_start.sh writes it when a node joins; `deploy` rewrites it on every
  live node from the config it deploys, with `kvstore.mooncake.write_worker_config`.
- The KV indexer binds `routing.events_host`, so it is pinned to the head.

Per-pool autoscaling is read from an optional `autoscaling` section of each
pool (`min_replicas`, `max_replicas`, `target_ongoing_requests`, and
optionally `forecast`, common/config/autoscale.py); without one the fixed
`replicas` apply. `baton up` applies the same section to its local stack
(`autoscaling_overrides`). Where both pools forecast with `app_level` on,
`app_policy` gives Serve one application-level policy for both, and the app
is deployed through Serve's config path (cluster/rollout.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

from cluster import ingress
from cluster.rollout import rollout
from deployments.autoscaling import autoscaling
from common.config import BatonConfig, ConfigError, PoolConfig, load_config
from common.constants import RAY_NAMESPACE
from common.listeners import is_loopback
from common.progress import Progress

DEFAULT_NODE_DIR = "/tmp/baton"
DEFAULT_WORKER_CONFIG = f"{DEFAULT_NODE_DIR}/mooncake.json"
HEAD_RESOURCE = "node:__internal_head__"
AUTOSCALING_KEYS = ("min_replicas", "max_replicas", "target_ongoing_requests",
                    "upscale_delay_s", "downscale_delay_s", "forecast")
POOL_DEPLOYMENTS = {"prefill": "prefill", "decode": "decode"}
READY_TIMEOUT_S = 1800


def _is_loopback(host: str | None) -> bool:
    return not host or is_loopback(host)


def localize(cfg: BatonConfig, head_ip: str) -> tuple[BatonConfig, list[str]]:
    """A copy of `cfg` with loopback hosts replaced by the head's IP.

    Returns the copy and one line per change. Used by `deploy` and by
    cluster/ray_up/scripts/node_env.py, so both compute the same addresses.
    """
    out = cfg.model_copy(deep=True)
    changes: list[str] = []
    if _is_loopback(out.mooncake.host):
        changes.append(f"mooncake.host: {out.mooncake.host} -> {head_ip}")
        out.mooncake.host = head_ip
    url = urlparse(out.redis.url)
    if _is_loopback(url.hostname):
        netloc = head_ip + (f":{url.port}" if url.port else "")
        if url.username or url.password:
            netloc = f"{url.username or ''}:{url.password or ''}@{netloc}"
        new = urlunparse(url._replace(netloc=netloc))
        changes.append(f"redis.url: {out.redis.url} -> {new}")
        out.redis.url = new
    if _is_loopback(out.routing.events_host):
        changes.append(f"routing.events_host: {out.routing.events_host} -> {head_ip}")
        out.routing.events_host = head_ip
    return out, changes


def pool_autoscaling(pool: PoolConfig, name: str, kind: str | None = None,
                     config_path: str | Path | None = None) -> dict[str, Any] | None:
    """Serve's `autoscaling_config` for a pool, or None for a fixed size.

    Reads `pool.autoscaling` (a pydantic model or a mapping) if the config has
    one. `replicas` becomes Serve's `initial_replicas`, clamped to the bounds.
    With `forecast`, the pool gets the forecast policy (deployments/autoscaling/autoscaling.py)
    for `kind` (prefill, decode or colocated; default `name`), its capacity curve
    read beside `config_path` or from `forecast.capacity_file`.
    Raises ConfigError naming the field.
    """
    raw = getattr(pool, "autoscaling", None)
    if raw is None:
        return None
    data = raw.model_dump(exclude_none=True) if hasattr(raw, "model_dump") else dict(raw)
    if data.pop("enabled", True) is False:
        return None
    unknown = set(data) - set(AUTOSCALING_KEYS)
    if unknown:
        raise ConfigError(f"{name}.autoscaling: unknown key(s) {', '.join(sorted(unknown))}")
    lo = int(data.get("min_replicas", 1))
    hi = int(data.get("max_replicas", max(lo, pool.replicas)))
    if lo < 0 or hi < 1 or hi < lo:
        raise ConfigError(f"{name}.autoscaling: need 0 <= min_replicas <= max_replicas and "
                          f"max_replicas >= 1 (got {lo}..{hi})")
    target = float(data.get("target_ongoing_requests", 2))
    if target <= 0:
        raise ConfigError(f"{name}.autoscaling.target_ongoing_requests must be > 0")
    out: dict[str, Any] = {
        "min_replicas": lo,
        "max_replicas": hi,
        "initial_replicas": min(max(pool.replicas, lo, 1), hi),
        "target_ongoing_requests": target,
        # Requests bypass Serve's handles: scale on what replicas report in flight.
        "policy": {"policy_function": autoscaling.POLICY},
    }
    for key in ("upscale_delay_s", "downscale_delay_s"):
        if key in data:
            out[key] = float(data[key])
    if data.get("forecast") is not None:
        return _forecast(out, name, kind or name, data["forecast"], config_path)
    return out


def _forecast_section(name: str, raw, config_path):
    """(ForecastAutoscaling, its capacity curves) of pool `name`'s forecast section."""
    from pydantic import ValidationError

    from common.config.autoscale import ForecastAutoscaling
    from deployments.autoscaling import capacity

    try:
        forecast = ForecastAutoscaling.model_validate(raw)
        return forecast, capacity.load_for_config(config_path, forecast.capacity_file)
    except (ValidationError, ValueError, OSError) as exc:
        raise ConfigError(f"{name}.autoscaling.forecast: {exc}") from None


def _forecast(base: dict[str, Any], name: str, kind: str, raw, config_path) -> dict[str, Any]:
    forecast, curves = _forecast_section(name, raw, config_path)
    return autoscaling.forecast_autoscaling(base, kind, forecast, curves)


def app_policy(cfg: BatonConfig, config_path: str | Path | None = None) -> dict[str, Any] | None:
    """Serve's application-level autoscaling policy (AppForecastPolicy), or None.

    Present when the config is disaggregated, both pools autoscale on a forecast,
    and the decode pool's forecast has `app_level` on; the decode pool's section
    then holds the settings for both, each pool keeping its own bounds. Deploying
    with it goes through Serve's config path (cluster/rollout.py). Raises
    ConfigError naming the field."""
    if cfg.colocated:
        return None
    pools = plan(cfg, config_path)["pools"]
    auto = {name: p["autoscaling"] for name, p in pools.items()}
    if any(a is None or a["policy"]["policy_function"] != autoscaling.FORECAST_POLICY for a in auto.values()):
        return None
    forecast, curves = _forecast_section("decode", cfg.decode.autoscaling.forecast, config_path)
    if not forecast.app_level:
        return None
    return autoscaling.app_autoscaling_policy(
        {POOL_DEPLOYMENTS[name]: (name, a) for name, a in auto.items()}, forecast, curves)


def plan(cfg: BatonConfig, config_path: str | Path | None = None) -> dict[str, Any]:
    """What `deploy` will ask Serve for, per pool: a summary that is also printed."""
    pools = {}
    for name in ("decode",) if cfg.colocated else ("prefill", "decode"):
        pool: PoolConfig = getattr(cfg, name)
        auto = pool_autoscaling(pool, name, "colocated" if cfg.colocated else name, config_path)
        pools[name] = {
            "replicas": pool.replicas,
            "autoscaling": auto,
            "ray_actor_options": pool.resources.ray_actor_options(),
            "max_ongoing_requests": pool.max_ongoing_requests,
        }
    result: dict[str, Any] = {"colocated": cfg.colocated, "pools": pools}
    if not cfg.colocated:
        result["pd_ratio"] = f"{cfg.prefill.replicas}:{cfg.decode.replicas}"
    return result


def rewrite(app, overrides: dict[str, dict[str, Any]]):
    """The same application graph with Serve options changed per deployment name.

    `deployments.app.build_app` fixes `num_replicas`; autoscaling and the
    indexer's head pin are applied here, with Serve's own
    `Deployment.options`, so deployments/app.py stays the one place the
    graph is defined.
    """
    from ray.serve import Application

    dep = app._bound_deployment
    args = tuple(rewrite(a, overrides) if isinstance(a, Application) else a for a in dep.init_args)
    kwargs = {k: rewrite(v, overrides) if isinstance(v, Application) else v
              for k, v in dep.init_kwargs.items()}
    opts = dict(overrides.get(dep.name, {}))
    if "ray_actor_options" in opts:
        merged = dict(dep.ray_actor_options or {})
        extra = opts.pop("ray_actor_options")
        merged["resources"] = {**merged.get("resources", {}), **extra.get("resources", {})}
        opts["ray_actor_options"] = merged
    return Application(dep.options(_init_args=args, _init_kwargs=kwargs, **opts))


def autoscaling_overrides(cfg: BatonConfig, config_path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Per-deployment `autoscaling_config` of the pools that have an `autoscaling` section."""
    return {POOL_DEPLOYMENTS[name]: {"autoscaling_config": pinfo["autoscaling"]}
            for name, pinfo in plan(cfg, config_path)["pools"].items() if pinfo["autoscaling"]}


def overrides(cfg: BatonConfig, config_path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Per-deployment Serve options `deploy` adds to the graph of build_app."""
    out: dict[str, dict[str, Any]] = {}
    if cfg.routes():
        # Engines publish KV events to routing.events_host, the head.
        out["kv_indexer"] = {"ray_actor_options": {"resources": {HEAD_RESOURCE: 0.001}}}
    out.update(autoscaling_overrides(cfg, config_path))
    return out


def build(cfg: BatonConfig, worker_config: Path, config_path: str | Path | None = None):
    """The application `deploy` hands to serve.run (needs Ray Serve, not a cluster)."""
    from deployments.app import build_app

    return rewrite(build_app(cfg, worker_config), overrides(cfg, config_path))


def head_ip_of_cluster() -> str:
    import ray

    for node in ray.nodes():
        if node.get("Alive") and HEAD_RESOURCE in node.get("Resources", {}):
            return node["NodeManagerAddress"]
    raise RuntimeError("no live head node found in the Ray cluster")


def distribute_worker_config(cfg: BatonConfig, path: Path) -> list[str]:
    """Writes the workers' Mooncake JSON at `path` on every live node.

    One zero-CPU task per node, pinned with NodeAffinitySchedulingStrategy.
    Returns one line per node saying whether the file changed.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from kvstore import mooncake

    wanted = mooncake.worker_config(cfg.mooncake)

    @ray.remote(num_cpus=0)
    def write(target: str, content: dict) -> tuple[str, str]:
        import json as _json
        from pathlib import Path as _Path

        import os as _os

        p = _Path(target)
        try:
            before = _json.loads(p.read_text()) if p.exists() else None
        except ValueError:
            before = "unreadable"
        p.parent.mkdir(parents=True, exist_ok=True)
        # Atomic: nodes that share a filesystem (the one-machine flow, NFS
        # homes) write the same file at once; a reader never sees it half-written.
        tmp = p.with_name(f".{p.name}.{_os.getpid()}.tmp")
        tmp.write_text(_json.dumps(content, indent=2))
        _os.replace(tmp, p)
        state = "created" if before is None else ("unchanged" if before == content else "updated")
        return ray.util.get_node_ip_address(), state

    refs = [
        write.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
        .remote(str(path), wanted)
        for n in ray.nodes() if n.get("Alive")
    ]
    return [f"{ip}: {state}" for ip, state in ray.get(refs, timeout=120)]


def use_cluster_token() -> None:
    """Clients of a `ray start` cluster send its token (Ray 2.60 enables token
    auth there by default; the token is ~/.ray/auth_token, or RAY_AUTH_TOKEN /
    RAY_AUTH_TOKEN_PATH). Without RAY_AUTH_MODE=token the driver is refused."""
    if os.environ.get("RAY_AUTH_MODE"):
        return
    token_file = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", "~/.ray/auth_token")).expanduser()
    if os.environ.get("RAY_AUTH_TOKEN") or token_file.is_file():
        os.environ["RAY_AUTH_MODE"] = "token"


def _cluster_ingress(cfg: BatonConfig, source: str) -> None:
    """Sets serve.ingress as a cluster runs it (`auto`: direct); raises ConfigError for haproxy."""
    cfg.serve.ingress = ingress.resolve(cfg.serve.ingress, on_cluster=True)
    if cfg.serve.ingress != "direct":
        raise ConfigError(f"serve.ingress in {source}: `haproxy` is run by `baton up` on its one node; on a "
                          "cluster the decode replicas serve serve.port themselves (`direct`), behind your "
                          "load balancer")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="baton deploy", description=__doc__.splitlines()[0])
    p.add_argument("--config", help="Baton config YAML (default: $BATON_CONFIG or built-in defaults)")
    p.add_argument("--address", default=os.environ.get("RAY_ADDRESS", "auto"),
                   help="Ray cluster: 'auto' on the head, or ray://HEAD:10001 (default: $RAY_ADDRESS or auto)")
    p.add_argument("--worker-config", default=os.environ.get("BATON_WORKER_CONFIG", DEFAULT_WORKER_CONFIG),
                   help=f"path of the workers' Mooncake JSON on every node (default {DEFAULT_WORKER_CONFIG})")
    p.add_argument("--head-ip", help="the head's IP for loopback hosts in the config (default: from Ray)")
    p.add_argument("--dry-run", action="store_true", help="validate and print the plan; connect to nothing")
    p.add_argument("--no-wait", action="store_true", help="return once Serve accepted the app")
    p.add_argument("--timeout", type=float, default=READY_TIMEOUT_S, help="seconds to wait for RUNNING")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    path = args.config or os.environ.get("BATON_CONFIG")
    source = path or "<defaults>"
    try:
        cfg = load_config(path)
        _cluster_ingress(cfg, source)
        summary = plan(cfg, path)
    except ConfigError as exc:
        print(f"baton deploy: {exc}", file=sys.stderr)
        return 2
    worker_config = Path(args.worker_config)
    if not worker_config.is_absolute():
        print("baton deploy: --worker-config must be an absolute path (the same on every node)",
              file=sys.stderr)
        return 2
    print(f"config {source}")
    print(json.dumps(summary, indent=2))
    if args.dry_run:
        if args.head_ip:
            for line in localize(cfg, args.head_ip)[1]:
                print(f"  {line}")
        return 0
    use_cluster_token()  # before anything imports ray (vLLM does), which reads it once
    try:
        from actors import engine_args

        engine_args.validate(cfg, source)
    except ImportError:
        print("  (vLLM not installed here: engine_args are checked by the replicas)")
    except ConfigError as exc:
        print(f"baton deploy: {exc}", file=sys.stderr)
        return 2

    import ray
    from ray import serve

    ray.init(address=args.address, namespace=RAY_NAMESPACE, logging_level="WARNING")
    try:
        head_ip = args.head_ip or head_ip_of_cluster()
        cfg, changes = localize(cfg, head_ip)
        print(f"head {head_ip}")
        for line in changes:
            print(f"  {line}")
        print(f"workers' Mooncake config {worker_config}:")
        for line in distribute_worker_config(cfg, worker_config):
            print(f"  {line}")
        serve.start(proxy_location="Disabled")  # decode replicas serve the public port
        rollout(build(cfg, worker_config, path), Progress(total=0), args.timeout, wait=not args.no_wait,
                app_policy=app_policy(cfg, path))
        print(f"Baton is deployed: http://{head_ip}:{cfg.serve.port}/v1/chat/completions")
        return 0
    except (RuntimeError, TimeoutError, ConfigError) as exc:
        print(f"baton deploy: {exc}", file=sys.stderr)
        return 1
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
