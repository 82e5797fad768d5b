"""`baton status`'s Mooncake probe against real master and store processes."""

from __future__ import annotations

import time

from cluster import loopback
from common.config import MooncakeConfig
from common.processes import free_ports
from kvstore import health, mooncake


def _wait_state(cfg, want: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    state = health.check(cfg).state
    while state != want and time.monotonic() < deadline:
        time.sleep(0.5)
        state = health.check(cfg).state
    return state


def test_store_health_follows_the_processes(tmp_path):
    p = free_ports(5)
    cfg = MooncakeConfig(master_port=p[0], metadata_port=p[1], master_metrics_port=p[2],
                         store_port=p[3], store_http_port=p[4], global_segment_size="16MB")
    master = mooncake.master_process(cfg, tmp_path)
    store = mooncake.store_process(cfg, tmp_path)
    for proc in (master, store):
        proc.env.update(loopback.env())  # wildcard binds on loopback
    assert health.check(cfg).state == "down"
    try:
        master.start()
        master.wait_ready(30)
        assert _wait_state(cfg, "degraded") == "degraded"  # master up, no store
        store.start()
        store.wait_ready(30)
        assert _wait_state(cfg, "healthy") == "healthy"
        h = health.check(cfg)
        assert h.capacity["memory_capacity_bytes"] >= 16 * 10**6
        store.stop()
        assert _wait_state(cfg, "degraded") == "degraded"  # what `status` shows while the store is dead
    finally:
        store.stop()
        master.stop()
    assert _wait_state(cfg, "down") == "down"
