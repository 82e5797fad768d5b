"""Open-loop chat load for `baton bench scale`: Poisson arrivals at a fixed rate, light on the client.

One aiohttp session sends every request at its arrival time whatever the
server's state (open loop: a slow server builds a queue, it does not slow
the sender down). Each answer's own `metrics` (vLLM's per-request timing,
`serve.request_metrics` / `--enable-per-request-metrics`) gives the
engine's time from queueing to the last token (non-streamed) or to the first
token (streamed); the client's time minus that is what the serving layer in
front of the engine added.

`summarize` is pure: shots in, figures out.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

import aiohttp

from common.constants import CORPUS
from common.stats import percentile


@dataclass
class Shot:
    """One request's outcome: HTTP status (0: no answer), client latency to the last byte, client time to
    the first token (streams), the engine's own time for the same span (None without metrics)."""

    status: int
    latency_s: float
    ttft_s: float | None = None
    engine_s: float | None = None
    error: str = ""


def chat_bodies(n: int, words: int, max_tokens: int, model: str, stream: bool, seed: int) -> list[dict]:
    """`n` chat bodies of about `words` corpus words each, every one with a prefix of its own (so no
    prompt reuses another's cached blocks). The timed executor never samples a stop token, so each answer
    is exactly `max_tokens` long."""
    vocab = CORPUS.read_text().split()
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = f"request {seed}-{i}: " + " ".join(rng.choice(vocab) for _ in range(words))
        body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                "temperature": 0}
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        out.append(body)
    return out


def _engine_span(metrics: dict | None, first_token: bool) -> float | None:
    """Seconds the engine spent on the request from queueing to its first (or last) token."""
    if not metrics or metrics.get("queue_time_ms") is None or metrics.get("time_to_first_token_ms") is None:
        return None
    ms = metrics["queue_time_ms"] + metrics["time_to_first_token_ms"]
    if not first_token:
        ms += metrics.get("generation_time_ms") or 0.0
    return ms / 1000


async def _send(session: aiohttp.ClientSession, url: str, body: dict, headers: dict) -> Shot:
    t0 = time.perf_counter()
    try:
        async with session.post(url, json=body, headers=headers) as resp:
            if not body.get("stream"):
                doc = await resp.read()
                t = time.perf_counter() - t0
                if resp.status != 200:
                    return Shot(resp.status, t, error=doc[:200].decode(errors="replace"))
                return Shot(200, t, engine_s=_engine_span(json.loads(doc).get("metrics"), first_token=False))
            ttft = metrics = None
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(line[6:])
                if ttft is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", ())):
                    ttft = time.perf_counter() - t0
                metrics = chunk.get("metrics") or metrics
            return Shot(resp.status, time.perf_counter() - t0, ttft, _engine_span(metrics, first_token=True))
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        return Shot(0, time.perf_counter() - t0, error=f"{type(e).__name__}: {e}")


async def _open_loop(url: str, bodies: list[dict], rate: float, seed: int, timeout_s: float,
                     tenants: int) -> list[Shot]:
    rng = random.Random(seed)
    conn = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        start, at, tasks = time.perf_counter(), 0.0, []
        for i, body in enumerate(bodies):
            at += rng.expovariate(rate)
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            headers = {"authorization": f"Bearer bench-tenant-{i % tenants}"}
            tasks.append(asyncio.create_task(_send(session, url, body, headers)))
        return list(await asyncio.gather(*tasks))


def run(base_url: str, bodies: list[dict], rate: float, seed: int = 0, timeout_s: float = 120,
        tenants: int = 8) -> tuple[list[Shot], float]:
    """Sends `bodies` to base_url's chat endpoint as Poisson arrivals at `rate` per second; returns each
    request's Shot and the wall seconds from the first send to the last answer."""
    t0 = time.perf_counter()
    shots = asyncio.run(_open_loop(base_url + "/v1/chat/completions", bodies, rate, seed, timeout_s, tenants))
    return shots, time.perf_counter() - t0


def _ms(values: list[float], q: float) -> float | None:
    v = percentile(values, q)
    return None if v is None else round(v * 1000, 2)


def summarize(shots: list[Shot], wall_s: float, offered: float, slo_s: float) -> dict:
    """Throughput, goodput (answers within `slo_s`: to the first token for streams, to the last byte
    otherwise), client latency and what the serving layer added over the engine's own time."""
    ok = [s for s in shots if s.status == 200]
    key = [s.ttft_s if s.ttft_s is not None else s.latency_s for s in ok]
    good = sum(k <= slo_s for k in key)
    added = [k - s.engine_s for k, s in zip(key, ok) if s.engine_s is not None]
    errors: dict[str, int] = {}
    for s in shots:
        if s.status != 200:
            errors[str(s.status)] = errors.get(str(s.status), 0) + 1
    return {"offered_rps": offered, "sent": len(shots), "ok": len(ok), "errors": errors,
            "throughput_rps": round(len(ok) / wall_s, 2), "goodput_rps": round(good / wall_s, 2),
            "latency_p50_ms": _ms(key, 50), "latency_p99_ms": _ms(key, 99),
            "added_p50_ms": _ms(added, 50), "added_p99_ms": _ms(added, 99), "with_engine_metrics": len(added),
            "first_error": next((s.error for s in shots if s.error), "")}
