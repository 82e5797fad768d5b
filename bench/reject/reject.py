"""`baton bench reject`: what one refused request costs the front, in microseconds.

A front whose permits are all held and whose queue takes no more answers every
completion request 429. This measures that path three ways:

- in process: the front's ASGI call alone (auth, headers, admission, the 429),
  wall time per call on one thread;
- over HTTP: the same front under uvicorn in a child process, driven by
  keep-alive clients on loopback for a few seconds; the server's CPU time
  (from /proc) divided by the 429s it sent, and the latency clients saw;
- what refusing before the body saves: reading and validating a typical chat
  body (about 300 words), which the front skipped for a refused request;
- with ``--paths``, what sharing permits across fronts would add to each
  admission, per mechanism (bench/reject/admission_paths.py).

No engine, Ray or Redis: the rejection path touches none of them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import aiohttp
import psutil

from common.config import AdmissionConfig, BatonConfig
from deployments.api.api_keys import KeyTable, hash_key
from bench.common.stack import bench_workdir
from common.processes import ManagedProcess, free_ports
from common.stats import percentile
from deployments.admission import Admission, AsyncAdmission
from deployments.api.apis import APIS
from deployments.front.front import Front
from deployments.front.metrics import IngressMetrics

PATH = "/v1/chat/completions"
KEY = "key-bench"


def _front() -> Front:
    """A front with its one permit held and no queue: every completion is refused."""
    cfg = BatonConfig.model_validate({"serve": {"api_keys": {hash_key(KEY): "bench"}}})
    gate = AsyncAdmission(Admission(AdmissionConfig(capacity_per_replica=1, max_queue_per_tenant=0,
                                                    max_queue_total=0)))
    gate.admission.submit("holder", None, time.monotonic(), 3600)  # holds the only permit
    return Front(cfg, "bench", None, None, None, gate, IngressMetrics(), None, None, None,
                 KeyTable(cfg.serve.api_keys))


def _body() -> bytes:
    words = " ".join(f"word{i % 97}" for i in range(300))
    return json.dumps({"model": BatonConfig().model.served_name, "max_tokens": 64,
                       "messages": [{"role": "user", "content": words}]}).encode()


async def _in_process(n: int) -> dict:
    front, body = _front(), _body()
    scope = {"type": "http", "path": PATH, "method": "POST",
             "headers": [(b"authorization", f"Bearer {KEY}".encode()), (b"content-type", b"application/json")]}
    statuses: list[int] = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])
    for _ in range(200):
        await front(scope, receive, send)
    t0 = time.perf_counter()
    for _ in range(n):
        await front(scope, receive, send)
    per_call = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n // 10):
        front.pipeline.parse.validated(APIS[PATH], body)
    parse = (time.perf_counter() - t0) / (n // 10)
    assert set(statuses) == {429}, statuses
    return {"reject_us": round(per_call * 1e6, 1), "skipped_parse_us": round(parse * 1e6, 1)}


def serve(port: int) -> None:
    """Child process: the refusing front under uvicorn on loopback."""
    import uvicorn

    uvicorn.run(_front(), host="127.0.0.1", port=port, http="httptools", lifespan="off",
                access_log=False, log_level="warning")


async def _http(port: int, server_pid: int, seconds: float, clients: int) -> dict:
    url, body = f"http://127.0.0.1:{port}{PATH}", _body()
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    lat, codes, retry = [], {}, 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as http:
        async def client(until: float):
            nonlocal retry
            while time.perf_counter() < until:
                t0 = time.perf_counter()
                async with http.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    codes[resp.status] = codes.get(resp.status, 0) + 1
                    retry += "Retry-After" in resp.headers
                lat.append(time.perf_counter() - t0)
        await asyncio.gather(*(client(time.perf_counter() + 1) for _ in range(clients)))  # warm-up
        lat.clear(), codes.clear()
        retry = 0
        proc = psutil.Process(server_pid)
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.perf_counter()
        await asyncio.gather(*(client(time.perf_counter() + seconds) for _ in range(clients)))
        cpu, wall = sum(proc.cpu_times()[:2]) - cpu0, time.perf_counter() - t0
    n = sum(codes.values())
    return {"requests": n, "status_codes": {str(k): v for k, v in codes.items()}, "with_retry_after": retry,
            "server_cpu_us_per_reject": round(cpu / n * 1e6, 1), "rejects_per_s": round(n / wall),
            "client_latency_p50_us": round(percentile(lat, 50) * 1e6), "client_latency_p99_us":
            round(percentile(lat, 99) * 1e6)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baton bench reject", description=__doc__)
    parser.add_argument("--calls", type=int, default=20000, help="in-process calls")
    parser.add_argument("--seconds", type=float, default=5, help="HTTP load duration")
    parser.add_argument("--clients", type=int, default=8, help="keep-alive HTTP clients")
    parser.add_argument("--paths", action="store_true", help="also time the permit-sharing mechanisms")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    print("in process ...", file=sys.stderr, flush=True)
    out = {"in_process": asyncio.run(_in_process(args.calls))}
    port = free_ports(1)[0]
    child = ManagedProcess("refusing-front", [sys.executable, "-m", "bench.reject.reject", "--serve", str(port)],
                           bench_workdir("bench-reject") / "front.log", ready_port=("127.0.0.1", port))
    child.start()
    try:
        child.wait_ready(30)
        print(f"over HTTP, {args.clients} clients, {args.seconds:g} s ...", file=sys.stderr, flush=True)
        out["http"] = asyncio.run(_http(port, child.pid, args.seconds, args.clients))
    finally:
        child.stop()
    if args.paths:
        from bench.reject import admission_paths

        print("permit-sharing mechanisms ...", file=sys.stderr, flush=True)
        out["sharing"] = admission_paths.measure()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
