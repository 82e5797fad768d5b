"""Health and capacity of the Mooncake master and store, read over HTTP.

The master exposes Prometheus gauges on its metrics port; the store process
answers /health on its HTTP port. Reading them changes nothing.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field

from common.config import MooncakeConfig

_GAUGES = {
    "master_allocated_bytes": "memory_used_bytes",
    "master_total_capacity_bytes": "memory_capacity_bytes",
    "master_key_count": "keys",
}


@dataclass
class StoreHealth:
    master_ok: bool
    store_ok: bool
    capacity: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def state(self) -> str:
        if self.master_ok and self.store_ok:
            return "healthy"
        return "degraded" if self.master_ok or self.store_ok else "down"


def _get(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback/cluster URL
        return resp.read().decode()


def parse_master_metrics(text: str) -> dict[str, float]:
    """Picks the capacity gauges out of the master's Prometheus text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.partition(" ")
        if name in _GAUGES:
            out[_GAUGES[name]] = float(value)
    return out


def check(cfg: MooncakeConfig, timeout: float = 2.0) -> StoreHealth:
    """Probes master metrics and store /health; never raises."""
    health = StoreHealth(master_ok=False, store_ok=False)
    errors = []
    try:
        health.capacity = parse_master_metrics(
            _get(f"http://{cfg.host}:{cfg.master_metrics_port}/metrics", timeout)
        )
        health.master_ok = True
    except Exception as exc:  # noqa: BLE001 - any failure is "not ok"
        errors.append(f"master: {exc}")
    try:
        body = json.loads(_get(f"http://{cfg.host}:{cfg.store_http_port}/health", timeout))
        health.store_ok = body.get("status") == "healthy"
    except Exception as exc:  # noqa: BLE001
        errors.append(f"store: {exc}")
    health.error = "; ".join(errors) or None
    return health
