"""Calibration: tokens/s per replica against batch size, per pool, from a running stack.

Writes the capacity curve file of deployments/autoscaling/capacity.py, to be stored beside
the config (`<config stem>.capacity.yaml`), which the forecast autoscaling
policy reads. Needs a stack serving at `--url` (`baton up` or a cluster); it
starts nothing. For each batch size b of `--batches` (1 2 4 8) it keeps b
requests in flight for `--seconds` (after `--warmup` uncounted seconds) with
fresh random token-id prompts (no prefix cache hits) and counts what the
answers' `usage` reports:

- prefill: `--prompt` tokens in, 1 out: prompt tokens/s (minus cached);
- decode: 16 tokens in, `--output` out (`ignore_eos`): output tokens/s;
- colocated (``--colocated``, one pool does both): whole requests, `--prompt`
  tokens in and `--colocated-output` out (`ignore_eos`): prompt tokens/s, so
  the figure counts the decoding each request also costs (a prompt-only load
  measured 30k tokens/s at batch 1 on 2 cores, ten times what the engine
  serves with 64 tokens out).

A pool's rate is the stack's divided by its replicas (`--prefill-replicas`,
`--decode-replicas`): run it with one replica per pool for a per-replica
curve. Progress on stderr, the curve as one JSON line on stdout.

    python -m bench.autoscale.capacity_curve --url http://127.0.0.1:8000 --out cluster/ray_up/baton/cluster.capacity.yaml
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import yaml

from bench.common.loadgen import VOCAB_HIGH, VOCAB_LOW

DECODE_PROMPT = 16


def _log(msg: str) -> None:
    print(f"[capacity_curve] {msg}", file=sys.stderr, flush=True)


async def _one(client, url: str, model: str, prompt: int, output: int, rng: random.Random) -> dict:
    body = {"model": model, "prompt": [rng.randint(VOCAB_LOW, VOCAB_HIGH) for _ in range(prompt)],
            "max_tokens": output, "ignore_eos": True, "temperature": 0.0}
    r = await client.post(f"{url}/v1/completions", json=body)
    r.raise_for_status()
    return r.json().get("usage") or {}


async def measure(url: str, model: str, batch: int, prompt: int, output: int, seconds: float,
                  warmup: float, seed: int) -> dict:
    """`batch` closed loops for `warmup` + `seconds`; the usage of requests that finished in
    the measured window, and its length."""
    import httpx

    rng = random.Random(seed)
    start = time.monotonic()
    counted = {"prompt": 0, "cached": 0, "output": 0, "requests": 0}

    async def loop(client) -> None:
        while time.monotonic() - start < warmup + seconds:
            usage = await _one(client, url, model, prompt, output, rng)
            if time.monotonic() - start >= warmup:
                counted["prompt"] += int(usage.get("prompt_tokens") or 0)
                counted["cached"] += int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                counted["output"] += int(usage.get("completion_tokens") or 0)
                counted["requests"] += 1

    async with httpx.AsyncClient(timeout=300) as client:
        await asyncio.gather(*(loop(client) for _ in range(batch)))
    elapsed = time.monotonic() - start - warmup
    return {**counted, "seconds": round(elapsed, 2)}


def _point(batch: int, tokens: float, seconds: float, replicas: int) -> dict:
    return {"batch": batch, "tokens_per_s": round(tokens / seconds / replicas, 2)}


async def calibrate(args: argparse.Namespace) -> dict:
    """Every batch size for each pool; returns the curve file's content."""
    pools: dict[str, dict] = {}
    kinds = ["colocated"] if args.colocated else ["prefill", "decode"]
    for kind in kinds:
        decode = kind == "decode"
        prompt, output = ((DECODE_PROMPT, args.output) if decode else
                          (args.prompt, args.colocated_output) if kind == "colocated" else (args.prompt, 1))
        replicas = args.decode_replicas if kind != "prefill" else args.prefill_replicas
        points = []
        for b in args.batches:
            m = await measure(args.url, args.model, b, prompt, output, args.seconds, args.warmup, args.seed + b)
            tokens = m["output"] if decode else m["prompt"] - m["cached"]
            points.append(_point(b, tokens, m["seconds"], replicas))
            _log(f"{kind} batch {b}: {m['requests']} requests, {points[-1]['tokens_per_s']} tokens/s per replica")
        pools[kind] = {"unit": "output_tokens" if decode else "prompt_tokens",
                       "tokens_per_request": output if decode else prompt, "points": points}
    return {"version": 1, "model": args.model, "hardware": args.hardware,
            "source": f"bench/autoscale/capacity_curve.py against {args.url}, {args.seconds:.0f} s per batch size, "
                      f"{time.strftime('%Y-%m-%d')}", "pools": pools}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.autoscale.capacity_curve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the running stack's endpoint")
    p.add_argument("--model", default="baton-tiny")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--prompt", type=int, default=400, help="prompt tokens of the prefill load")
    p.add_argument("--output", type=int, default=128, help="output tokens of the decode load")
    p.add_argument("--seconds", type=float, default=20.0, help="measured seconds per batch size")
    p.add_argument("--warmup", type=float, default=3.0, help="uncounted seconds first")
    p.add_argument("--colocated", action="store_true", help="one colocated pool")
    p.add_argument("--colocated-output", type=int, default=64, help="output tokens of the colocated load")
    p.add_argument("--prefill-replicas", type=int, default=1)
    p.add_argument("--decode-replicas", type=int, default=1)
    p.add_argument("--hardware", default="", help="what ran the stack, for the file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the curve file (YAML) here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    doc = asyncio.run(calibrate(args))
    if args.out is not None:
        from deployments.autoscaling.capacity import CapacityFile

        CapacityFile.model_validate(doc)  # what the loader will accept
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(yaml.safe_dump(doc, sort_keys=False))
        _log(f"wrote {args.out}")
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
