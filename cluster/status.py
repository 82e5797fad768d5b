"""`baton status`: the health of each component of a running stack.

Reads the state file that `baton up` wrote and probes each component over
its own protocol. Probing changes nothing.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from urllib.parse import urlparse
from dataclasses import asdict, dataclass

from common.config import BatonConfig, parse_size
from common.constants import APP_NAME, RAY_NAMESPACE
from cluster import loopback
from cluster.launcher import state_file
from common.processes import pid_alive
from kvstore import health as kv_health
from kvstore.spill import dir_usage
from routing.prefix.redis_state import INDEXER_STATS_KEY, Registry, registry_key


@dataclass
class Component:
    name: str
    state: str  # healthy | degraded | down
    detail: str = ""


def _redis(cfg: BatonConfig) -> Component:
    try:
        cfg.redis.client(socket_timeout=2).ping()
        url = urlparse(cfg.redis.url)  # a password in the URL is not shown
        return Component("redis", "healthy", f"{url.scheme}://{url.hostname}:{url.port or 6379}{url.path}")
    except Exception as exc:  # noqa: BLE001
        return Component("redis", "down", str(exc))


def _indexer(cfg: BatonConfig) -> Component | None:
    """The KV indexer's totals, which it writes to Redis every second; None when nothing routes."""
    if not cfg.routes():
        return None
    try:
        raw = cfg.redis.client(socket_timeout=2).hgetall(INDEXER_STATS_KEY)
    except Exception as exc:  # noqa: BLE001
        return Component("kv-indexer", "down", str(exc))
    if not raw:
        return Component("kv-indexer", "degraded", "no counts in Redis yet")
    detail = ", ".join(f"{k.decode().replace('_', ' ')} {int(v)}" for k, v in sorted(raw.items()))
    return Component("kv-indexer", "healthy", detail)


def _engines(cfg: BatonConfig) -> list[Component]:
    """One line per routed engine from its registry entry: its load and the rates its steps
    measured (actors/vllm_plugin.py), which the router prices candidates with; [] when
    nothing routes."""
    if not cfg.routes():
        return []
    try:
        client = cfg.redis.client(socket_timeout=2)
        pools = {pool: Registry.entries(client.hgetall(registry_key(pool))) for pool in ("prefill", "decode")}
    except Exception as exc:  # noqa: BLE001
        return [Component("engines", "down", str(exc))]
    out = []
    registry = Registry(None, cfg.routing.replica_timeout_s)
    for pool, entries in pools.items():
        fresh = registry.fresh(entries, time.time())
        for name, e in sorted(entries.items()):
            rates = ("rates not measured yet" if not e.get("prefill_s_per_token") else
                     f"prefill {1000 * e['prefill_s_per_token']:.3f} ms/token, "
                     f"pool load {1000 * e.get('load_s_per_token', 0):.4f} ms/token, "
                     f"step {1000 * e.get('step_s', 0):.1f} ms ({e.get('fit_steps', 0)} steps)")
            spec = ("" if "spec_drafts" not in e else
                    f"; speculation: {e['spec_drafts']} drafts, acceptance {e.get('spec_acceptance_rate', '-')}, "
                    f"mean accepted length {e.get('spec_mean_accepted_length', '-')}")
            out.append(Component(f"{pool}:{name}"[:16], "healthy" if name in fresh else "down",
                                 f"running {e.get('running', 0)}, waiting {e.get('waiting', 0)}, "
                                 f"KV empty {e.get('kv_empty_blocks', '?')}/{e.get('kv_blocks', '?')} blocks; "
                                 f"{rates}{spec}"))
    return out


def _mooncake(cfg: BatonConfig) -> Component:
    h = kv_health.check(cfg.mooncake)
    cap = h.capacity
    detail = (f"memory {cap.get('memory_used_bytes', 0) / 2**20:.1f}/"
              f"{cap.get('memory_capacity_bytes', 0) / 2**20:.0f} MiB, keys {int(cap.get('keys', 0))}")
    if not h.master_ok:
        detail = h.error or ""
    if cfg.mooncake.spill:
        used, objects = dir_usage(cfg.spill_path())
        detail += (f"; disk {used / 2**20:.1f}/{parse_size(cfg.mooncake.spill_cap) / 2**20:.0f} MiB, "
                   f"{objects} objects in {cfg.spill_path()}")
    return Component("mooncake", h.state, detail)


def _residence(baton: dict) -> str:
    return " (resident)" if baton.get("resident") else " (asleep)" if baton.get("asleep") else ""


def _http(url: str) -> Component:
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as resp:  # noqa: S310
            # A catalogue's entries say whether they are resident on the replica that answered.
            models = [m["id"] + _residence(m.get("baton", {})) for m in json.loads(resp.read())["data"]]
        return Component("endpoint", "healthy", f"{url} serving {', '.join(models)}")
    except Exception as exc:  # noqa: BLE001
        return Component("endpoint", "down", f"{url}: {exc}")


def _serve(address: str) -> list[Component]:
    # `baton up` started Ray with token auth (Ray's default); use its token.
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    if address.startswith("127."):  # a `baton up` stack: Ray in its one-machine mode
        loopback.use_local_ray()
    import ray
    from ray import serve

    try:
        ray.init(address=address, namespace=RAY_NAMESPACE, logging_level="ERROR", log_to_driver=False)
        app = serve.status().applications.get(APP_NAME)
    except Exception as exc:  # noqa: BLE001
        return [Component("ray", "down", str(exc))]
    out = [Component("ray", "healthy", address)]
    if app is None:
        return out + [Component("serve", "down", "app 'baton' not deployed")]
    for name, dep in app.deployments.items():
        counts = ", ".join(f"{str(getattr(k, 'value', k)).lower()} {v}" for k, v in dep.replica_states.items())
        state = "healthy" if dep.status.value == "HEALTHY" else "degraded"
        out.append(Component(f"pool:{name}", state, counts))
    ray.shutdown()
    return out


def collect(cfg: BatonConfig) -> dict:
    """Every component's state, plus overall `healthy` if all are."""
    path = state_file(cfg)
    if not path.exists():
        return {"running": False, "components": [], "healthy": False}
    state = json.loads(path.read_text())
    comps = [Component("baton-up", "healthy" if pid_alive(state["pid"]) else "down", f"pid {state['pid']}")]
    comps.append(_redis(cfg) if cfg.redis.start_local or cfg.redis.url else Component("redis", "down"))
    comps.append(_mooncake(cfg))
    comps.extend(_serve(state["ray_address"]))
    if (indexer := _indexer(cfg)) is not None:
        comps.append(indexer)
    comps.extend(_engines(cfg))
    comps.append(_http(state["url"]))
    return {
        "running": True,
        "healthy": all(c.state == "healthy" for c in comps),
        "components": [asdict(c) for c in comps],
    }


def render(report: dict) -> str:
    if not report["running"]:
        return "baton is not running (no state file)"
    lines = [f"{'component':<16} {'state':<9} detail"]
    for c in report["components"]:
        lines.append(f"{c['name']:<16} {c['state']:<9} {c['detail']}")
    lines.append("overall: " + ("healthy" if report["healthy"] else "NOT healthy"))
    return "\n".join(lines)
