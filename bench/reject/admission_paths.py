"""What each way of sharing permits across fronts would add to one admission.

Measured for `baton bench reject --paths`, to choose the mechanism of
deployments/admission/permit_leases.py:

- ``redis_per_request``: a Lua acquire and a Lua release on a real
  redis-server on loopback, from an asyncio client, as a front would do
  for every admitted request if the pool's count lived only in Redis;
- ``actor_per_request``: an acquire and a release call on one Ray admission
  actor (a local Ray with one CPU), as a front would do with a single
  admission actor;
- ``lease_renewal``: one renewal of deployments/admission/permit_leases.py (the Lua
  lease script with the demand of two tenants), which runs every 50 ms in
  the background and never on the request path.

Each figure is the wall time per admission (or per renewal) on an idle loop.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import redis.asyncio

from common.config import AdmissionConfig
from common.processes import free_ports, redis_process
from deployments.admission import Admission, AsyncAdmission

_ACQUIRE = """
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n >= tonumber(ARGV[1]) then return 0 end
redis.call('INCR', KEYS[1])
return 1
"""
_RELEASE = "return redis.call('DECR', KEYS[1])"


async def _redis_paths(url: str, n: int) -> dict:
    from deployments.admission.permit_leases import PermitLeases

    client = redis.asyncio.Redis.from_url(url)
    acquire, release = client.register_script(_ACQUIRE), client.register_script(_RELEASE)
    for _ in range(100):
        await acquire(keys=["bench:permits"], args=[1 << 30])
        await release(keys=["bench:permits"])
    t0 = time.perf_counter()
    for _ in range(n):
        await acquire(keys=["bench:permits"], args=[1 << 30])
        await release(keys=["bench:permits"])
    per_request = (time.perf_counter() - t0) / n
    cfg = AdmissionConfig()
    gate = AsyncAdmission(Admission(cfg))
    for tenant in ("heavy", "light"):
        await gate.acquire(tenant)
    leases = PermitLeases(client, "bench-front", cfg, gate)
    t0 = time.perf_counter()
    for _ in range(n):
        await leases.tick()
    renewal = (time.perf_counter() - t0) / n
    await client.aclose()
    return {"redis_per_request_us": round(per_request * 1e6, 1), "lease_renewal_us": round(renewal * 1e6, 1)}


def _actor_path(n: int) -> float:
    import ray

    @ray.remote(num_cpus=0)
    class Gate:
        def __init__(self) -> None:
            self.in_use = 0

        def acquire(self) -> bool:
            self.in_use += 1
            return True

        def release(self) -> None:
            self.in_use -= 1

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        gate = Gate.remote()

        async def run() -> float:
            for _ in range(100):
                await gate.acquire.remote()
                await gate.release.remote()
            t0 = time.perf_counter()
            for _ in range(n):
                await gate.acquire.remote()
                await gate.release.remote()
            return (time.perf_counter() - t0) / n
        return asyncio.run(run())
    finally:
        ray.shutdown()


def measure(n: int = 2000) -> dict:
    """The three figures of the module docstring, in microseconds."""
    with tempfile.TemporaryDirectory() as tmp:
        port = free_ports(1)[0]
        server = redis_process("127.0.0.1", port, Path(tmp), Path(tmp) / "redis.log")
        server.start()
        try:
            server.wait_ready(10)
            out = asyncio.run(_redis_paths(f"redis://127.0.0.1:{port}/0", n))
        finally:
            server.stop()
    out["actor_per_request_us"] = round(_actor_path(n) * 1e6, 1)
    return out
