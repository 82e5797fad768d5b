"""`baton bench autoscale --real`'s calibration: one replica's capacity curve, measured with the run's own requests.

The forecast policy turns a forecast rate into replicas through a capacity
curve (deployments/autoscaling/capacity.py). For the real run that curve must be the one
of the replicas the run scales: the same CPU share (`resources.cpu_quota`,
common/cpu_slice.py) and the same requests (streamed chats of 300 words,
about 800 prompt tokens, and 64 out, bench/autoscale/autoscale_real.py). So before the policies
run, one stack with one such replica serves closed loops of 1, 2, 4 and 8
clients of those requests; the answers per second at each batch, times the
prompt's tokens, and the TTFT p90 of those answers are the colocated pool's
curve, written as a capacity file that both policies' configs name. With
TTFTs in the curve, the policy sizes a replica by the largest batch whose
first tokens come within its share of the SLO, not by the time of a whole
answer (deployments/autoscaling/capacity.py). The ramp's rates are then set from what one
replica is planned to carry by that curve (`planned_rps`), so the top of the
ramp needs more replicas than one by the policy's own sizing.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import yaml

from bench.common.stack import StackProcess, write_config
from common.stats import percentile
from deployments.autoscaling.capacity import PoolCurve
from deployments.autoscaling.scale_policy import PolicyParams, PoolSizer

BATCHES = (1, 2, 4, 8)
WARMUP_S = 4.0


async def _closed_loop(url: str, batch: int, seconds: float, one) -> tuple[float, float | None]:
    """Answers per second with `batch` clients each sending `one`'s request after the last answered,
    and the TTFT p90 of those answers (None if none came)."""
    done, ttfts, start = [0], [], time.monotonic()
    counted_from, deadline = start + WARMUP_S, start + WARMUP_S + seconds

    async def client(http: httpx.AsyncClient, k: int) -> None:
        rng, i = random.Random(k), 0
        while time.monotonic() < deadline:
            i += 1
            _, ttft = await one(http, url, k * 100000 + i, rng)
            if ttft is not None and time.monotonic() >= counted_from:
                done[0] += 1
                ttfts.append(ttft)

    async with httpx.AsyncClient(timeout=120) as http:
        await asyncio.gather(*(client(http, k) for k in range(batch)))
    return done[0] / seconds, percentile(ttfts, 90)


def _prompt_tokens(url: str, body: dict) -> int:
    """The prompt tokens the engine counts for one of the run's requests (usage of a plain answer)."""
    r = httpx.post(f"{url}/v1/chat/completions", json={**body, "stream": False, "max_tokens": 1}, timeout=120)
    r.raise_for_status()
    return int(r.json()["usage"]["prompt_tokens"])


def calibrate(workdir: Path, quota: float | None, seconds: float, one, sample_body: dict) -> Path:
    """Measures one replica (capped at `quota` cores) and writes its curve to workdir/capacity.yaml;
    returns that path. `one` is the run's request coroutine, `sample_body` one of its bodies."""
    resources = {"cpu_quota": quota} if quota else {}
    stack = StackProcess(write_config(workdir / "calibrate", colocated=True, tracing={"exporter": "none"},
                                      decode={"replicas": 1, "resources": resources}))
    print("[autoscale --real] calibrating one replica", file=sys.stderr, flush=True)
    stack.start()
    try:
        prompt = _prompt_tokens(stack.url, sample_body)
        points = []
        for b in BATCHES:
            rps, ttft = asyncio.run(_closed_loop(stack.url, b, seconds, one))
            print(f"[autoscale --real]   batch {b}: {rps:.2f} answers/s, TTFT p90 {ttft} s", file=sys.stderr,
                  flush=True)
            point = {"batch": b, "tokens_per_s": round(rps * prompt, 1)}
            points.append(point if ttft is None else {**point, "ttft_s": round(ttft, 3)})
    finally:
        stack.stop()
    doc = {"version": 1, "model": "baton-tiny", "source": "bench/autoscale/autoscale_calibrate.py",
           "hardware": f"one replica capped at {quota} cores" if quota else "one replica, uncapped",
           "pools": {"colocated": {"unit": "prompt_tokens", "tokens_per_request": prompt, "points": points}}}
    path = workdir / "capacity.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def planned_rps(curve: dict, params: PolicyParams) -> float:
    """Requests per second one replica is planned to carry by `curve` (a capacity file's pool
    entry), as the forecast policy sizes it: its target batch's rate times the planned utilization."""
    pool = PoolCurve.model_validate(curve)
    sizer = PoolSizer("colocated", pool, replace(params, prompt_tokens=curve["tokens_per_request"]))
    return sizer.per_replica / curve["tokens_per_request"]
