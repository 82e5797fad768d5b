"""A catalogue model in its own environment: a Ray actor with the entry's `runtime_env`.

A catalogue entry with `runtime_env` (common/config/models.py) does not run
in the replica's process tree: the replica's ModelHost starts a
`ModelEngineActor` on its own node with that runtime_env (its own
`py_modules`, `pip` packages or environment variables, as Omni gives each
model its own virtual environment), and the actor runs the model's engine and
vLLM's app on a loopback port. The replica reaches it through `RemoteEngine`,
which looks like an EngineApp to the ModelHost: its `app` forwards each
request to the actor's port and streams the answer back, so the replica's
Finisher still finishes the answers and counts their usage.

The actor is owned by the replica (no detached lifetime): it dies with it.
"""

from __future__ import annotations

import asyncio

import aiohttp

from common.config import BatonConfig
from common.config.models import for_model

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class ModelEngineActor:
    """Ray actor: one catalogue model's engine and vLLM app in the entry's environment."""

    def __init__(self, cfg: dict, model: str, replica: str):
        self.cfg = BatonConfig.model_validate(cfg)
        self.entry = next(m for m in self.cfg.models if m.id == model)
        self.replica, self.engine, self.server = replica, None, None

    async def start(self) -> dict:
        """Starts the engine (from a standby of this environment) and its server on loopback; returns
        {"url", "pids"}. Raises what the engine start raised."""
        from actors.fast_start import use_standby
        from actors.openai_app import EngineApp
        from deployments import gc_pauses
        from deployments.serving import engine_pids, listen_socket, serve_asgi

        if self.cfg.catalogue.standby:
            use_standby()
        self.engine = EngineApp(for_model(self.cfg, self.entry), "colocated", self.replica)
        await self.engine.start()
        sock = listen_socket("127.0.0.1", 0, reuse_port=False)
        self.server, _ = serve_asgi(self.engine.direct, sock)
        gc_pauses.space_out()  # its requests allocate as a front's do (deployments/gc_pauses.py)
        host, port = sock.getsockname()[:2]
        return {"url": f"http://{host}:{port}", "pids": engine_pids(self.engine)}

    def probe(self, module: str) -> dict:
        """What this environment imports as `module`: its version and file (for checks and support)."""
        import importlib

        mod = importlib.import_module(module)
        return {"version": getattr(mod, "__version__", None), "file": getattr(mod, "__file__", None)}

    def running(self) -> int:
        return self.engine.running() if self.engine is not None else 0

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()


class RemoteEngine:
    """The ModelHost's handle on a ModelEngineActor: an EngineApp's surface over Ray and HTTP."""

    def __init__(self, cfg: BatonConfig, model: str, replica: str, runtime_env: dict):
        self.cfg, self.model, self.replica, self.runtime_env = cfg, model, replica, runtime_env
        self.actor, self.url, self.pids, self.dead = None, None, [], False
        self.http: aiohttp.ClientSession | None = None
        self.capacity_blocks = 0
        self.direct = self.app  # what a front calls, as EngineApp's (the actor's side calls its routes directly)

    async def start(self) -> None:
        """Starts the actor on this node with the merged runtime_env and waits for its engine."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ctx = ray.get_runtime_context()
        env = dict(self.runtime_env)
        inherited = (ctx.runtime_env or {}).get("env_vars") or {}
        env["env_vars"] = {**inherited, **(env.get("env_vars") or {})}
        self.actor = ray.remote(ModelEngineActor).options(
            num_cpus=0, runtime_env=env, name=actor_name(self.replica, self.model), namespace="baton",
            scheduling_strategy=NodeAffinitySchedulingStrategy(ctx.get_node_id(), soft=False),
        ).remote(self.cfg.model_dump(), self.model, self.replica)
        started = await self.actor.start.remote()
        self.url, self.pids = started["url"], started["pids"]
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self.loop = asyncio.get_running_loop()

    async def app(self, scope, receive, send):
        """ASGI: the request, forwarded to the actor's vLLM app; its answer streamed back."""
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        path = scope["path"] + (f"?{scope['query_string'].decode()}" if scope.get("query_string") else "")
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
                   if k.decode("latin-1").lower() not in _HOP | {"host"}}
        try:
            resp = await self.http.request(scope["method"], self.url + path, data=body, headers=headers)
        except (aiohttp.ClientError, OSError):
            self.dead = True  # the next request drops this model and wakes it again
            raise
        async with resp:
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": [(k, v) for k, v in resp.raw_headers if k.decode().lower() not in _HOP]})
            async for chunk in resp.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    def running(self) -> int:
        return 0  # the actor's queue is not read per request; the host counts requests in flight

    def errored(self) -> bool:
        return self.dead or self.actor is None

    def shutdown(self) -> None:
        """Stops the actor (and with it the engine's processes)."""
        import ray

        if self.http is not None:  # shutdown runs off the loop (ModelHost._drop): the session closes on it
            asyncio.run_coroutine_threadsafe(self.http.close(), self.loop)
            self.http = None
        if self.actor is not None:
            try:
                ray.get(self.actor.shutdown.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - a dead actor has nothing left to stop
                pass
            ray.kill(self.actor)
            self.actor = None


def actor_name(replica: str, model: str) -> str:
    """The Ray name of a replica's actor for `model` (namespace `baton`)."""
    return f"baton-model:{replica}:{model}"
