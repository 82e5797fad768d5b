"""/metrics of a whole pool: one front's metrics summed with its peers' and the KV indexer's totals."""

from __future__ import annotations

import asyncio

import aiohttp
import redis

from deployments.metrics import IngressMetrics, merge
from routing.redis_state import INDEXER_STATS_KEY


async def pool_metrics(metrics: IngressMetrics, replica: str, peers: dict, http: aiohttp.ClientSession,
                       client=None) -> bytes:
    """`metrics` summed with every other live replica's in `peers` (registry entries; a replica
    going away leaves with its counts), plus the indexer's totals read through `client` (Redis)
    when the stack routes. Changes nothing."""
    texts = [metrics.render()]
    for other, entry in peers.items():
        if other == replica or "url" not in entry:
            continue
        try:
            async with http.get(f"{entry['url']}/baton/metrics", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                if resp.status == 200:
                    texts.append(await resp.read())
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            continue
    return merge(texts) + (await _indexer_metrics(client) if client is not None else b"")


async def _indexer_metrics(client) -> bytes:
    """The KV indexer's totals (it has no port of its own), as counters."""
    try:
        raw = await client.hgetall(INDEXER_STATS_KEY)
    except redis.RedisError:
        return b""
    lines = []
    for name, value in sorted(raw.items()):
        metric = f"baton_indexer_{name.decode()}_total"
        lines += [f"# HELP {metric} KV indexer: {name.decode().replace('_', ' ')}", f"# TYPE {metric} counter",
                  f"{metric} {float(value)}"]
    return ("\n".join(lines) + "\n").encode() if lines else b""
