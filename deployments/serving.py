"""An ASGI app served in this process, and the processes of the engine behind it.

`listen_socket` and `serve_asgi` put an app on a port (a replica's front and
internal app, deployments/replica.py; a catalogue model's vLLM app inside its
actor, deployments/catalogue/model_actor.py), and `drain` takes it off again once
the requests it runs are answered; `engine_pids` lists an engine's processes
(the ModelHost ranks and reports them, deployments/catalogue/model_host.py).
"""

from __future__ import annotations

import asyncio
import socket
import time


def listen_socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    """A bound, listening TCP socket; SO_REUSEPORT lets replicas share a port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def serve_asgi(app, sock: socket.socket):
    """uvicorn serving the ASGI `app` on `sock` in the running loop: (server, its serve task)."""
    import uvicorn

    config = uvicorn.Config(app, http="httptools", loop="none", lifespan="off", access_log=False,
                            log_level="warning", timeout_keep_alive=30)
    server = uvicorn.Server(config)
    return server, asyncio.ensure_future(server.serve(sockets=[sock]))


def drain(servers, tasks, timeout_s: float, poll_s: float = 0.02) -> bool:
    """Stops `serve_asgi`'s `servers` (uvicorn closes their listeners, ends idle keep-alive
    connections and lets each request it runs finish) and blocks this thread, which must not be
    the servers' loop's, until their serve `tasks` are done, at most `timeout_s`; whether they all
    are. Requests still running then are the caller's to end."""
    for server in servers:
        server.should_exit = True
    deadline = time.monotonic() + timeout_s
    while not all(t.done() for t in tasks):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def engine_pids(engine) -> list[int]:
    """The engine core's process and its children (the worker); a RemoteEngine's as its actor said."""
    import psutil

    if hasattr(engine, "pids"):
        return list(engine.pids)

    manager = getattr(getattr(engine.engine, "engine_core", None), "resources", None)
    procs = getattr(getattr(manager, "engine_manager", None), "processes", None) or []
    pids = []
    for proc in procs:
        try:
            pids += [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return pids
