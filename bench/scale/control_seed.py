"""What both control-plane figures seed and read in Redis: replica names and heartbeat entries,
prompt tokens, and Redis's own usage (bench/scale/scale_control.py, bench/scale/scale_indexer.py)."""

from __future__ import annotations

import json
import random
import sys
import time

from actors.sim.profile import GpuProfile
from routing.prefix import redis_state

TENANTS = 8
VOCAB = 128_000


def log(progress: bool, msg: str) -> None:
    if progress:
        print(f"[bench scale control] {msg}", file=sys.stderr, flush=True)


def replica_names(n: int, prefix: str = "r") -> list[str]:
    return [f"{prefix}{i:03d}" for i in range(n)]


def register_replicas(client, names: list[str], profile: GpuProfile, rng: random.Random, replay: dict | None = None) -> None:
    """Heartbeat entries for `names` in the decode pool (sync client)."""
    now = time.time()
    entries = {}
    for i, n in enumerate(names):
        free = rng.randint(0, profile.num_gpu_blocks // 4)
        waiting = rng.random() < 0.2
        entries[n] = json.dumps({
            "capacity_blocks": profile.num_gpu_blocks, "kv_blocks": profile.num_gpu_blocks,
            "kv_free_blocks": free + rng.randint(0, 2000), "kv_empty_blocks": free,
            "running": rng.randint(20, 60), "waiting": int(waiting) * rng.randint(1, 4),
            "oldest_wait_s": round(rng.uniform(0, 0.5), 3) if waiting else 0.0, "unfinished": rng.randint(20, 64),
            "prefill_s_per_token": 2.6e-5, "load_s_per_token": 1.5e-6, "url": f"http://10.0.{i // 200}.{i % 200}:8001",
            **({"events_replay": replay[n]} if replay else {}), "ts": now})
    client.hset(redis_state.registry_key("decode"), mapping=entries)


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def redis_usage(client) -> tuple[int, float]:
    """(commands processed, CPU seconds used) by the Redis server so far, from INFO."""
    info = client.info()
    return int(info["total_commands_processed"]), float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
