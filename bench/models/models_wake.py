"""The wake part of `baton bench models` (bench/models/models.py): a cold model's first answer on a catalogue
stack against a fresh `vllm serve` of the same model, timed from its process start."""

from __future__ import annotations

import json
import random
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.models.models_stack import MODELS, answer_once, chat_body, log, ratio, resident, scrape, stack_config
from bench.models.models_plot import delta, rounded
from bench.common.stack import StackProcess
from common.constants import CORPUS
from common.stats import percentile

WAKE_MEMORY_GB = 0.6  # two of the wake stack's three models: each is 0.25 GiB of KV cache and 2-16 MB of weights
WAKE_MIN_RESIDENT_S = 2.0


def timed_chat(url: str, model: str, body: dict, since: float | None = None) -> dict:
    """Streams one chat request; seconds from `since` (default: the send) to the first body byte, the first
    content token and the end."""
    t0 = time.perf_counter()
    since = t0 if since is None else since
    first_byte = first_token = None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "model": model, "stream": True},
                      timeout=600) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            first_byte = first_byte or time.perf_counter()
            if first_token is None and line.startswith("data: {"):
                if any((c.get("delta") or {}).get("content") for c in json.loads(line[6:]).get("choices") or []):
                    first_token = time.perf_counter()
    end = time.perf_counter()
    return {"first_byte_s": round(first_byte - since, 4), "ttft_s": round((first_token or end) - since, 4),
            "total_s": round(end - since, 4)}


def _others(model: str) -> list[str]:
    """The two models the wake stack serves besides `model`: the first two others of MODELS."""
    return [m for m in MODELS if m != model][:2]


def _wake_config(args, workdir: Path) -> Path:
    ids = [m for m in MODELS if m == args.model or m in _others(args.model)]
    return stack_config(workdir, ids, WAKE_MEMORY_GB, WAKE_MIN_RESIDENT_S)


def baton_wake(args, workdir: Path, body: dict) -> dict:
    """A catalogue stack (room for two of three); the timed request for `args.model` once it is cold."""
    stack = StackProcess(_wake_config(args, workdir))
    stack.start()
    try:
        answer_once(stack.url, args.model)  # a running stack has woken models before
        for _ in range(5):  # the others, until the model is evicted
            for other in _others(args.model):
                answer_once(stack.url, other)
            if args.model not in resident(stack.url):
                break
        time.sleep(WAKE_MIN_RESIDENT_S + 0.5)  # both others may be evicted now
        before = scrape(stack.url)
        out = timed_chat(stack.url, args.model, body)
        d = delta(scrape(stack.url), before)
        n = d.get(("wake_s_count", args.model))
        out["wake_engine_s"] = round(d[("wake_s_sum", args.model)] / n, 3) if n else None
        out["resident_after"] = resident(stack.url)
    finally:
        stack.stop()
    return out


def vllm_start(args, workdir: Path, body: dict) -> dict:
    """A fresh `vllm serve` of `args.model` (the wake stack's engine settings), timed from its start."""
    from bench.common.peers import VllmServe
    from common.config import load_config
    from common.config.models import catalogue_models, for_model

    cfg = load_config(_wake_config(args, workdir), environ={})
    one = for_model(cfg, next(m for m in catalogue_models(cfg) if m.id == args.model))
    server = VllmServe(one, workdir / "vllm-serve.log")
    t0 = time.perf_counter()
    with started_fast(server):
        ready = time.perf_counter() - t0
        out = timed_chat(server.url, args.model, body, since=t0)
    return {"ready_s": round(ready, 3), **out}


@contextmanager
def started_fast(server):
    """Runs `server` (a bench.common.peers VllmServe) polling its /health every 50 ms, where entering it polls each
    second: its start-up is what is timed. Stops it (its process group) on exit."""
    server.spawn()
    try:
        while not _healthy(server.url):
            if server.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {server.proc.returncode}; see {server.log}")
            time.sleep(0.05)
        yield server
    finally:
        server.__exit__()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def run_wake(args, workdir: Path) -> dict:
    body = chat_body(random.Random(args.seed), args.prompt_words, args.max_tokens, CORPUS.read_text().split())
    rounds = []
    for n in range(args.wake_rounds):
        order = ("baton", "vllm_serve") if n % 2 == 0 else ("vllm_serve", "baton")
        rnd: dict = {"order": list(order)}
        for system in order:
            log(f"wake round {n + 1}/{args.wake_rounds}: {system} ...")
            fn = baton_wake if system == "baton" else vllm_start
            rnd[system] = fn(args, workdir / f"round{n + 1}-{system}", body)
            log(f"  {system}: {json.dumps(rnd[system])}")
        rnd["ratio"] = ratio(rnd["baton"]["ttft_s"], rnd["vllm_serve"]["ttft_s"])
        rounds.append(rnd)
    return {"model": args.model, "min_resident_s": WAKE_MIN_RESIDENT_S, "target_ratio": 0.25,
            "ratio_is": "baton TTFT of a cold model / vllm serve process start to first token",
            "rounds": rounds, "median_ratio": rounded(percentile([r["ratio"] for r in rounds], 50))}
