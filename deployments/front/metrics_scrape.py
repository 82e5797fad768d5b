"""/metrics of a whole pool: one front's metrics summed with its peers' and the KV indexer's totals,
and each replica's vLLM engine series (`vllm:*`, labelled with the replica), so that a dashboard
built for `vllm serve` works against Baton."""

from __future__ import annotations

import asyncio

import aiohttp
import redis

from deployments.front.metrics import IngressMetrics, merge
from routing.prefix.redis_state import INDEXER_STATS_KEY


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


class EngineSeries:
    """A Prometheus collector: vLLM's own series (`vllm:*`: requests running and waiting, KV cache
    usage, prefix-cache queries and hits, speculative decoding, latencies) from this process's
    default registry, each sample labelled `replica`. Changes nothing. With a model catalogue,
    vLLM keeps the series of the engine it started last."""

    def __init__(self, replica: str):
        self.replica = replica

    def collect(self):
        from prometheus_client import REGISTRY
        from prometheus_client.metrics_core import Metric

        for fam in REGISTRY.collect():
            if not fam.name.startswith("vllm:"):
                continue
            out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            for s in fam.samples:
                out.add_sample(s.name, {**s.labels, "replica": self.replica}, s.value, s.timestamp)
            yield out
