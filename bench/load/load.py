"""`baton bench load`: send a workload to an OpenAI endpoint and measure it.

Sends the `RequestSpec`s built by `bench.common.loadgen` at their times, streams
every answer (``stream_options.include_usage``) and measures TTFT (to the
first non-empty text delta), TPOT, end-to-end latency and tokens. Prints one
JSON summary line; ``--out-json`` adds every request, ``--out-csv`` writes
one row per request.

    baton bench load --workload trace --limit 200 --time-scale 0.05
    baton bench load --workload prefill-heavy --requests 32 --rate 2
    baton bench load --workload agentic --requests 4 --turns 5 --no-session-header

From Python (a notebook included): ``results, summary = run(url, specs)``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, fields
from pathlib import Path
from typing import Sequence

import httpx

from bench.common import loadgen
from bench.common.loadgen import RequestResult, RequestSpec
from common.constants import TRACE

DEFAULT_URL = "http://127.0.0.1:8000"


class _Bar:
    """Requests done on stderr: tqdm where installed, else a `\\r` counter."""

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.label, self.done, self._tqdm = total, label, 0, None
        self.enabled = enabled
        if enabled:
            try:
                from tqdm import tqdm

                self._tqdm = tqdm(total=total, desc=label, unit="req", file=sys.stderr, leave=False)
            except ImportError:
                pass

    def update(self) -> None:
        self.done += 1
        if self._tqdm is not None:
            self._tqdm.update(1)
        elif self.enabled:
            print(f"\r  {self.label}: {self.done}/{self.total} requests", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        elif self.enabled:
            print(file=sys.stderr, flush=True)


async def _stream(client: httpx.AsyncClient, url: str, body: dict, headers: dict[str, str],
                  result: RequestResult, sent: float) -> str:
    """POSTs one streaming request, filling ``result``; returns the answer text."""
    first = last = any_choice = None  # any_choice: TTFT fallback if no delta has text
    deltas = 0
    text: list[str] = []
    usage: dict | None = None
    async with client.stream("POST", url, json=body, headers=headers) as resp:
        if resp.status_code != 200:
            detail = (await resp.aread()).decode(errors="replace")[:300]
            raise RuntimeError(f"HTTP {resp.status_code}: {detail}")
        async for chunk in loadgen.sse_events(resp.aiter_lines()):
            if err := chunk.get("error"):
                raise RuntimeError(f"stream error: {err.get('message', err) if isinstance(err, dict) else err}")
            usage = chunk.get("usage") or usage
            result.baton = chunk.get("baton") or result.baton
            if chunk.get("choices") and any_choice is None:
                any_choice = time.perf_counter()
            for choice in chunk.get("choices") or []:
                piece = loadgen.choice_text(choice)
                if piece:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    deltas += 1
                    text.append(piece)
    done = time.perf_counter()
    result.e2e_s = done - sent
    result.ttft_s = (first or any_choice or done) - sent
    if usage:
        result.output_tokens = int(usage.get("completion_tokens") or 0)
        result.input_tokens = int(usage.get("prompt_tokens") or result.input_tokens)
        result.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    else:
        result.output_tokens = deltas
    if first and last and result.output_tokens > 1:
        result.tpot_s = (last - first) / (result.output_tokens - 1)
    if result.output_tokens == 0:
        raise RuntimeError("stream ended without any tokens")
    return "".join(text)


class _Sessions:
    """Turn order of multi-turn chat specs: each turn waits for the previous
    turn's answer and resends the whole conversation."""

    def __init__(self, specs: Sequence[RequestSpec]):
        self.done = {(s.session_id, s.turn): asyncio.Event() for s in specs if s.chat_history}
        self.history: dict[str | None, list[dict]] = {}

    async def messages(self, spec: RequestSpec) -> list[dict]:
        """Waits for the previous turn (and the think time); the messages to send."""
        if spec.turn > 0:
            await self.done[(spec.session_id, spec.turn - 1)].wait()
            if spec.session_id not in self.history:
                raise RuntimeError("previous turn failed")
            await asyncio.sleep(spec.think_s)
        return self.history.get(spec.session_id, []) + spec.body["messages"]

    def answered(self, spec: RequestSpec, messages: list[dict], answer: str) -> None:
        """Records the turn's answer as part of its session's conversation."""
        self.history[spec.session_id] = messages + [{"role": "assistant", "content": answer}]

    def finished(self, spec: RequestSpec, failed: bool) -> None:
        """Releases the next turn; a failed turn fails the rest of its session."""
        if failed:
            self.history.pop(spec.session_id, None)
        self.done[(spec.session_id, spec.turn)].set()


async def run_async(url: str, specs: Sequence[RequestSpec], *, model: str = "baton-tiny",
                    concurrency: int | None = None, timeout_s: float = 120.0,
                    deadline_s: float | None = None, slo_ttft_s: float = 1.0, slo_tpot_s: float = 0.1,
                    headers: dict[str, str] | None = None, progress: bool = True,
                    label: str = "load") -> tuple[list[RequestResult], dict]:
    """Sends ``specs`` to ``url`` and returns (one result per spec, summary).

    At most ``concurrency`` requests are in flight (None: no cap). Each
    request gets ``timeout_s`` in all; after ``deadline_s`` the run stops and
    what has not finished is reported as an error. Never raises for a failed
    request: its ``error`` says why.
    """
    url = url.rstrip("/")
    sem = asyncio.Semaphore(concurrency or len(specs) or 1)
    results: dict[int, RequestResult] = {}
    sessions = _Sessions(specs)
    bar = _Bar(len(specs), label, progress)
    limits = httpx.Limits(max_connections=concurrency or None, max_keepalive_connections=concurrency or None)
    t0 = time.perf_counter()

    async def one(client: httpx.AsyncClient, spec: RequestSpec) -> None:
        result = RequestResult(index=spec.index, session_id=spec.session_id, turn=spec.turn,
                               input_tokens=spec.input_tokens or 0)
        body = {**spec.body, "model": model, "stream": True, "stream_options": {"include_usage": True}}
        try:
            await asyncio.sleep(max(0.0, t0 + spec.at_s - time.perf_counter()))
            if spec.chat_history:
                body["messages"] = await sessions.messages(spec)
            async with sem:
                sent = time.perf_counter()
                result.sent_s = sent - t0
                answer = await asyncio.wait_for(
                    _stream(client, url + spec.endpoint, body, {**(headers or {}), **spec.headers}, result, sent),
                    timeout_s)
            if spec.chat_history:
                sessions.answered(spec, body["messages"], answer)
        except asyncio.TimeoutError:
            result.error = f"timeout after {timeout_s:g}s"
        except Exception as exc:  # noqa: BLE001 - every failure becomes a result
            result.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:  # also on cancellation, so that later turns never wait forever
            if spec.chat_history:
                sessions.finished(spec, bool(result.error))
        results[spec.index] = result
        bar.update()

    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
                                 limits=limits) as client:
        tasks = [asyncio.create_task(one(client, s)) for s in specs]
        _, pending = await asyncio.wait(tasks, timeout=deadline_s) if tasks else (set(), set())
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    wall = time.perf_counter() - t0
    bar.close()
    out = [results.get(s.index) or RequestResult(index=s.index, session_id=s.session_id, turn=s.turn,
                                                 error=f"run deadline of {deadline_s:g}s reached")
           for s in specs]
    return out, loadgen.summarize(out, slo_ttft_s, slo_tpot_s, wall)


def run(url: str, specs: Sequence[RequestSpec], **kwargs) -> tuple[list[RequestResult], dict]:
    """`run_async` for synchronous callers; works inside a running event loop too (notebooks)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_async(url, specs, **kwargs))
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run_async(url, specs, **kwargs)).result()


def _plain(v):
    return None if isinstance(v, float) and math.isnan(v) else v


def write_json(path: str | Path, summary: dict, results: Sequence[RequestResult], config: dict) -> None:
    rows = [{k: _plain(v) for k, v in asdict(r).items()} for r in results]
    Path(path).write_text(json.dumps({"config": config, "summary": summary, "requests": rows}, indent=1))


def write_csv(path: str | Path, results: Sequence[RequestResult]) -> None:
    names = [f.name for f in fields(RequestResult)]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=names)
        w.writeheader()
        for r in results:
            w.writerow({k: "" if _plain(v) is None else v for k, v in asdict(r).items()})


def build_specs(args: argparse.Namespace) -> list[RequestSpec]:
    if args.workload == "trace":
        return loadgen.trace_workload(
            args.trace, limit=args.limit, time_scale=args.time_scale, tokens_per_block=args.tokens_per_block,
            output_scale=args.output_scale, max_output_tokens=args.max_output_tokens,
            max_model_len=args.max_model_len, session_header=not args.no_session_header, salt=args.seed)
    return loadgen.synthetic_workload(
        args.workload, args.requests, rate=args.rate, seed=args.seed, input_tokens=args.input_tokens,
        output_tokens=args.output_tokens, turns=args.turns, think_s=args.think_time,
        session_header=not args.no_session_header, max_model_len=args.max_model_len)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="baton bench load", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=DEFAULT_URL)
    p.add_argument("--model", default="baton-tiny")
    p.add_argument("--api-key", help="sent as a Bearer token")
    p.add_argument("--workload", default="trace", choices=("trace",) + loadgen.SYNTHETIC)
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--limit", type=int, default=200, help="trace lines to replay")
    p.add_argument("--time-scale", type=float, default=1.0, help="trace arrival = timestamp x this (0: all at once)")
    p.add_argument("--tokens-per-block", type=int, default=16, help="tokens per trace hash id (trace: 512)")
    p.add_argument("--output-scale", type=float, help="trace output x this (default tokens-per-block/512)")
    p.add_argument("--max-output-tokens", type=int, default=256, help="cap on trace outputs")
    p.add_argument("--max-model-len", type=int, default=2048, help="prompt + output are capped to this")
    p.add_argument("--requests", type=int, default=32, help="synthetic requests (agentic: sessions)")
    p.add_argument("--turns", type=int, default=4, help="agentic turns per session")
    p.add_argument("--think-time", type=float, default=0.0, help="agentic pause after each answer (s)")
    p.add_argument("--input-tokens", type=int, help="synthetic mean input (agentic: words per turn)")
    p.add_argument("--output-tokens", type=int, help="synthetic output tokens")
    p.add_argument("--rate", type=float, help="Poisson arrivals per second (agentic: sessions); "
                                              "omitted: closed loop, all ready at once")
    p.add_argument("--concurrency", type=int, help="max requests in flight (default 8 closed loop, else no cap)")
    p.add_argument("--no-session-header", action="store_true", help="omit x-session-affinity")
    p.add_argument("--slo-ttft", type=float, default=1.0, help="goodput SLO on TTFT (s)")
    p.add_argument("--slo-tpot", type=float, default=0.1, help="goodput SLO on TPOT (s)")
    p.add_argument("--timeout", type=float, default=120.0, help="per request (s)")
    p.add_argument("--deadline", type=float, default=3600.0, help="whole run (s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-json", type=Path)
    p.add_argument("--out-csv", type=Path)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.workload == "trace" and not args.trace.exists():
        print(f"baton bench load: trace not found: {args.trace}", file=sys.stderr)
        return 2
    specs = build_specs(args)
    closed = args.rate is None if args.workload != "trace" else args.time_scale == 0
    concurrency = args.concurrency or (8 if closed else None)
    results, summary = run(
        args.url, specs, model=args.model, concurrency=concurrency, timeout_s=args.timeout,
        deadline_s=args.deadline, slo_ttft_s=args.slo_ttft, slo_tpot_s=args.slo_tpot,
        headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else None,
        progress=not args.no_progress, label=args.workload)
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "api_key"}
    config["concurrency"] = concurrency
    if args.out_json:
        write_json(args.out_json, summary, results, config)
    if args.out_csv:
        write_csv(args.out_csv, results)
    print(json.dumps({"workload": args.workload, "sessions": len({r.session_id for r in results if r.session_id}),
                      **summary}))
    return 0 if summary["completed"] else 1
