"""A client made with `reconnect=True` survives a Redis restart: each pooled connection that the
restart closed is retried once on a new one. Without it, each fails one command (the churn test
saw these as fallback routes)."""

from __future__ import annotations

import asyncio

import pytest

from common.config import RedisConfig
from tests.unit.conftest import restart_redis, start_redis

POOLED = 4


def _failures_after_restart(tmp_path, reconnect: bool) -> int:
    server, url = start_redis(tmp_path)
    client = RedisConfig(url=url).client(asynchronous=True, reconnect=reconnect, socket_timeout=5)

    async def run() -> int:
        # POOLED commands at once: the pool now holds that many idle connections.
        await asyncio.gather(*(client.blpop(["nothing"], timeout=0.1) for _ in range(POOLED)))
        server.stop()
        restart_redis(server)
        try:
            res = await asyncio.gather(*(client.set(f"k{i}", i) for i in range(POOLED)), return_exceptions=True)
            return sum(isinstance(r, Exception) for r in res)
        finally:
            await client.aclose()
            server.stop()
    return asyncio.run(run())


@pytest.mark.parametrize("reconnect", [False, True])
def test_pooled_connections_closed_by_a_restart(tmp_path, reconnect):
    failures = _failures_after_restart(tmp_path, reconnect)
    if reconnect:
        assert failures == 0
    else:  # the behaviour `reconnect` exists for: shows the test can tell the two apart
        assert failures > 0
