"""`baton bench overload`: goodput and per-tenant shares from 1x to 20x capacity.

For each ingress count (``--ingress``, default 1 and 2) starts the real stack
in colocated mode with that many decode replicas (each decode replica is an
ingress: it serves the public port), with two tenants (API keys). It measures
the stack's capacity in requests/s with closed loops at its permit count, then offers
open-loop Poisson load at each ``--levels`` multiple of it (default 1, 2, 5,
10, 20): tenant `heavy` sends 10/11 of it, tenant `light` 1/11. For each
level it records goodput (requests/s that succeed within the TTFT SLO) and
its ratio to goodput at 1x, each tenant's successes against its max-min fair
share, and the status codes seen: every rejection should be a 429 with
Retry-After, never a 5xx.

One JSON document goes to stdout and ``--out``; ``--plot`` draws goodput
ratio and fair shares against offered load; a markdown table goes to stderr
(and ``--markdown``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil

from bench.common import loadgen
from bench.common.loadgen import CHAT, RequestSpec
from bench.common.stack import StackProcess, bench_workdir, write_config
from common.constants import CORPUS, REPO_ROOT
from common.progress import Progress
from deployments.admission import max_min_fair_share
from deployments.api.api_keys import hash_key

KEYS = {"heavy": "key-heavy", "light": "key-light"}
SHARES = {"heavy": 10 / 11, "light": 1 / 11}
MODEL = "baton-tiny"


def _specs(rate: float, duration_s: float, seed: int, max_tokens: int, deadline_s: float,
           prompt_words: int = 0) -> list[RequestSpec]:
    vocab = CORPUS.read_text().split()
    rng = random.Random(seed)
    specs: list[RequestSpec] = []
    for tenant, share in SHARES.items():
        n = max(1, round(rate * share * duration_s))
        for at in loadgen.poisson_arrivals(n, rate * share, seed + len(specs)):
            words = " ".join(rng.choice(vocab) for _ in range(prompt_words))
            specs.append(RequestSpec(
                index=len(specs), at_s=at, endpoint=CHAT, session_id=tenant,
                body={"messages": [{"role": "user", "content": f"{tenant} request {len(specs)} {words}"}],
                      "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
                headers={"authorization": f"Bearer {KEYS[tenant]}", "x-baton-deadline-s": str(deadline_s)},
                output_tokens=max_tokens))
    return specs


# -- open-loop sender: keeps the status and Retry-After that bench.load.load drops ------


@dataclass
class Outcome:
    """What one overload request saw. ``status`` 0: no HTTP answer (transport
    error or timeout); a 200 whose stream broke off is not ``ok``."""

    tenant: str | None
    status: int = 0
    retry_after: bool = False
    ttft_s: float = math.nan
    tokens: int = 0
    error: str | None = None
    first_s: float = math.nan  # when its first token came, seconds from the start of the level

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.tokens > 0


async def _read_stream(resp: aiohttp.ClientResponse, out: Outcome, sent: float) -> None:
    async for chunk in loadgen.sse_events(resp.content):
        if err := chunk.get("error"):
            out.error = f"stream error: {err}"[:200]
            return
        for choice in chunk.get("choices") or []:
            if loadgen.choice_text(choice):
                out.tokens += 1
                if math.isnan(out.ttft_s):
                    out.ttft_s = time.perf_counter() - sent


async def _send(session: aiohttp.ClientSession, url: str, spec: RequestSpec, model: str,
                t0: float, timeout_s: float) -> Outcome:
    """Sends ``spec`` at its time, streaming; never raises for a failed request."""
    out = Outcome(tenant=spec.session_id)
    await asyncio.sleep(max(0.0, t0 + spec.at_s - time.perf_counter()))
    body = {**spec.body, "model": model, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url + spec.endpoint, json=body, headers=spec.headers) as resp:
                out.status = resp.status
                out.retry_after = "Retry-After" in resp.headers
                if resp.status != 200:
                    out.error = (await resp.text())[:200]
                else:
                    await _read_stream(resp, out, sent)
    except TimeoutError:
        out.error = f"timeout after {timeout_s:g}s"
    except Exception as exc:  # noqa: BLE001 - every failure becomes an outcome
        out.error = f"{type(exc).__name__}: {exc}"[:200]
    out.first_s = sent - t0 + out.ttft_s
    return out


async def send_open_loop(url: str, specs: list[RequestSpec], model: str = MODEL,
                         timeout_s: float = 60.0) -> tuple[list[Outcome], float]:
    """Sends every spec at its ``at_s`` with no cap on requests in flight;
    (one outcome per spec, wall seconds). Bounded: each request has
    ``timeout_s``, and the whole run ends ``timeout_s + 5`` after the last send."""
    url = url.rstrip("/")
    deadline = max((s.at_s for s in specs), default=0.0) + timeout_s + 5
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(_send(session, url, s, model, t0, timeout_s)) for s in specs]
        _, pending = await asyncio.wait(tasks, timeout=deadline) if tasks else (set(), set())
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        wall = time.perf_counter() - t0
    return [t.result() if t.done() and not t.cancelled() else
            Outcome(tenant=s.session_id, error="run deadline reached") for s, t in zip(specs, tasks)], wall


# -- statistics (pure) ------------------------------------------------------------


def _good(o: Outcome, duration_s: float, slo_ttft_s: float) -> bool:
    """Succeeded, within the TTFT SLO, and started (first token) inside the load window."""
    return o.ok and o.ttft_s <= slo_ttft_s and o.first_s <= duration_s


def _served(o: Outcome, duration_s: float) -> bool:
    """Succeeded and started (first token) inside the load window."""
    return o.ok and o.first_s <= duration_s


def tenant_stats(outcomes: list[Outcome], duration_s: float, slo_ttft_s: float) -> dict[str, dict]:
    """Per tenant: sent, served (see `_served`), good (also within the SLO),
    status codes, 429s without Retry-After, 5xx, and served requests/s
    against the tenant's max-min fair share of what the stack served in the
    window (the sum of served requests/s), so a miscalibrated capacity can
    neither flatter nor hurt fairness; the SLO is goodput's business."""
    sent = {t: sum(1 for o in outcomes if o.tenant == t) for t in KEYS}
    served = {t: sum(1 for o in outcomes if o.tenant == t and _served(o, duration_s)) for t in KEYS}
    delivered = sum(served.values()) / duration_s
    fair = max_min_fair_share({t: sent[t] / duration_s for t in KEYS}, {t: 1.0 for t in KEYS}, delivered)
    out: dict[str, dict] = {}
    for t in KEYS:
        mine = [o for o in outcomes if o.tenant == t]
        codes: dict[str, int] = {}
        for o in mine:
            codes[str(o.status)] = codes.get(str(o.status), 0) + 1
        out[t] = {"sent": sent[t], "succeeded": sum(1 for o in mine if o.ok), "served": served[t],
                  "good": sum(1 for o in mine if _good(o, duration_s, slo_ttft_s)),
                  "status_codes": dict(sorted(codes.items())),
                  "rejected_429": sum(1 for o in mine if o.status == 429),
                  "429_without_retry_after": sum(1 for o in mine if o.status == 429 and not o.retry_after),
                  "5xx": sum(1 for o in mine if 500 <= o.status < 600),
                  "failed_after_200": sum(1 for o in mine if o.status == 200 and not o.ok),
                  "share_of_served": round(served[t] / max(1, sum(served.values())), 3),
                  "pct_of_fair_share": round(100 * served[t] / duration_s / fair[t], 1) if fair[t] else None}
    return out


def level_stats(x: float, outcomes: list[Outcome], wall_s: float, capacity_rps: float,
                duration_s: float, slo_ttft_s: float) -> dict:
    """One level's summary (``goodput_ratio`` is filled in by `add_ratios`).

    Goodput counts requests that succeeded within the TTFT SLO and saw their
    first token inside the ``duration_s`` load window, over that window:
    queued requests the engines start after the window are not credited.
    """
    good = sum(1 for o in outcomes if _good(o, duration_s, slo_ttft_s))
    return {"x": x, "offered_rps": round(capacity_rps * x, 2), "requests": len(outcomes),
            "wall_s": round(wall_s, 2), "goodput_rps": round(good / duration_s, 2),
            "goodput_ratio": None, "tenants": tenant_stats(outcomes, duration_s, slo_ttft_s)}


def add_ratios(run_doc: dict) -> dict:
    """Sets each level's ``goodput_ratio``: its goodput over goodput at 1x
    (None where there is no 1x level or it had no goodput)."""
    base = next((lv["goodput_rps"] for lv in run_doc["levels"].values() if lv["x"] == 1), None)
    for lv in run_doc["levels"].values():
        lv["goodput_ratio"] = round(lv["goodput_rps"] / base, 3) if base else None
    return run_doc


# -- the run ----------------------------------------------------------------------


def _calibrate(url: str, replicas: int, args) -> float:
    """Capacity in requests/s: after a warm-up, ``permits`` closed loops of
    requests like the levels' own (each prompt different, as there) for
    ``--calibrate-s`` seconds."""
    permits = replicas * args.capacity_per_replica
    pool = iter(_specs(100.0, 60.0, args.seed + 1, args.max_tokens, 3600, args.prompt_words))

    async def loops() -> float:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            async def loop(until: float) -> int:
                n = 0
                while time.perf_counter() < until:
                    spec = dataclasses.replace(next(pool), at_s=0.0)
                    n += (await _send(session, url, spec, MODEL, time.perf_counter(), args.timeout)).ok
                return n
            await asyncio.gather(*(loop(time.perf_counter() + 2) for _ in range(permits)))
            t0 = time.perf_counter()
            done = await asyncio.gather(*(loop(t0 + args.calibrate_s) for _ in range(permits)))
            return sum(done) / (time.perf_counter() - t0)
    return asyncio.run(loops())


def _level(url: str, capacity_rps: float, x: float, args) -> dict:
    # The deadline header is the TTFT SLO: a request that cannot see its
    # first token in time is told so at once (429) instead of missing it.
    specs = _specs(capacity_rps * x, args.duration, args.seed, args.max_tokens, args.slo_ttft,
                   args.prompt_words)
    me = psutil.Process()
    cpu0 = sum(me.cpu_times()[:2])
    outcomes, wall = asyncio.run(send_open_loop(url, specs, timeout_s=args.timeout))
    lv = level_stats(x, outcomes, wall, capacity_rps, args.duration, args.slo_ttft)
    lv["loadgen_cpu_cores"] = round((sum(me.cpu_times()[:2]) - cpu0) / wall, 2)
    return lv


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def measure_ingress(replicas: int, args, progress: Progress) -> dict:
    """Starts the stack with ``replicas`` ingress (decode) replicas, calibrates,
    runs every level, stops it; the run's document."""
    workdir = bench_workdir(f"bench-overload-{replicas}")
    stack = StackProcess(write_config(
        workdir, colocated=args.mode == "colocated", tracing={"exporter": "none"},
        decode={"replicas": replicas},
        serve={"api_keys": {hash_key(KEYS["heavy"]): "heavy", hash_key(KEYS["light"]): "light"}},
        admission={"capacity_per_replica": args.capacity_per_replica}))
    with progress.step(f"ingress {replicas}: start the stack ({args.mode})"):
        stack.start()
    try:
        with progress.step(f"ingress {replicas}: calibrate capacity"):
            capacity = _calibrate(stack.url, replicas, args)
        _say(f"    capacity {capacity:.2f} req/s ({replicas} x {args.capacity_per_replica} permits)")
        doc = {"ingress_replicas": replicas, "mode": args.mode, "capacity_rps": round(capacity, 2),
               "capacity_per_replica": args.capacity_per_replica, "duration_s": args.duration,
               "slo_ttft_s": args.slo_ttft, "max_tokens": args.max_tokens, "levels": {}}
        for x in parse_levels(args.levels):
            with progress.step(f"ingress {replicas}: {x:g}x capacity ({capacity * x:.1f} req/s)"):
                lv = doc["levels"][f"{x:g}x"] = _level(stack.url, capacity, x, args)
            _say(f"    goodput {lv['goodput_rps']} req/s, light "
                 f"{lv['tenants']['light']['pct_of_fair_share']}% / heavy "
                 f"{lv['tenants']['heavy']['pct_of_fair_share']}% of fair share")
    finally:
        stack.stop()
    return add_ratios(doc)


def parse_levels(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def parse_ingress(text: str) -> list[int]:
    counts = [int(v) for v in text.split(",") if v.strip()]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"ingress counts must be >= 1, got {text!r}")
    return counts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="baton bench overload", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=20, help="seconds of load per level")
    p.add_argument("--levels", default="1,2,5,10,20", help="offered load as multiples of capacity")
    p.add_argument("--ingress", type=parse_ingress, default="1,2",
                   help="ingress (decode) replica counts to measure, one stack each")
    p.add_argument("--mode", choices=("colocated", "disaggregated"), default="colocated",
                   help="colocated: decode replicas also prefill; disaggregated adds 1 prefill replica")
    p.add_argument("--max-tokens", type=int, default=128, help="output tokens per request")
    p.add_argument("--prompt-words", type=int, default=50, help="corpus words per prompt")
    p.add_argument("--slo-ttft", type=float, default=2.0,
                   help="TTFT SLO, sent as each request's first-token deadline (s)")
    p.add_argument("--timeout", type=float, default=60.0, help="per request (s)")
    p.add_argument("--capacity-per-replica", type=int, default=4)
    p.add_argument("--calibrate-s", type=float, default=8.0, help="closed-loop capacity measurement (s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=REPO_ROOT / "docs/results/overload/overload.json", help="JSON result")
    p.add_argument("--plot", type=Path, default=REPO_ROOT / "docs/results/overload/overload.png", help="PNG figure")
    p.add_argument("--markdown", type=Path, help="also write the markdown table here")
    return p


def _write(doc: dict, args) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    from bench.overload.overload_plot import markdown_table, plot

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    doc: dict = {"runs": {}, "command": ["baton", "bench", "overload", *argv]}
    progress = Progress(len(args.ingress) * (2 + len(parse_levels(args.levels))), out=sys.stderr)
    for n in args.ingress:
        doc["runs"][str(n)] = measure_ingress(n, args, progress)
        _write(doc, args)  # a later stack that fails keeps what was measured
    print(json.dumps(doc))
    table = markdown_table(doc)
    _say("\n" + table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    plot(doc, args.plot)
    _say(f"wrote {args.out} and {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
