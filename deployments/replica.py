"""An engine replica: a Serve deployment hosting vLLM and its HTTP servers.

Serve owns the replica's life (placement by pool resources, health checks,
restarts, autoscaling); the requests themselves never cross a Ray hop. The
constructor starts a thread with its own event loop that builds the engine
and vLLM's OpenAI app (actors/openai_app.py) and serves:

- an internal server on `serve.internal_host` (a free port): vLLM's app
  behind the Finisher, for requests another replica's front forwards here,
  plus `POST /baton/prefill` on prefill replicas;
- on decode and colocated replicas, the public front (deployments/front/front.py)
  on `serve.host:serve.port` (or, behind `baton up`'s HAProxy, on loopback
  `serve.front_port`: cluster/ingress.py), bound with SO_REUSEPORT so every
  replica of a node shares it.

The replica's registry entry in Redis carries its internal URL; routers read
it from there. The constructor returns only when both servers listen.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import os
import socket
import threading
import time

from actors.finisher import Finisher
from actors.heartbeat import Heartbeat
from actors.openai_app import EngineApp
from common import core_fence, cpu_slice, tracing
from common.config import BatonConfig
from common.constants import REPO_ROOT
from deployments import gc_pauses, loop_lag
from deployments.autoscaling.autoscaling import SignalMeter
from deployments.serving import drain, listen_socket, serve_asgi

logger = logging.getLogger(__name__)


def replica_id() -> str:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - outside Serve (tests, scripts)
        return f"pid-{os.getpid()}"


def _internal_host(configured: str) -> str:
    if configured != "auto":
        return configured
    import ray

    return ray.util.get_node_ip_address()


# How long a stopping replica (a scale-down, a redeploy, `baton down`) lets the HTTP requests it
# runs finish before it stops its engine; an idle one stops at once. Serve kills the replica
# `graceful_shutdown_timeout_s` (deployments/app.py) after it began to stop, which leaves the
# engine's own shutdown a few seconds more.
DRAIN_S = 10.0
ENGINE_WATCH_S = 0.1  # how often a replica looks whether its engine died (`_watch_engine`)


class EngineReplica:
    """One engine replica of the prefill, decode or colocated pool."""

    def __init__(self, cfg: dict, role: str, *bound):
        self.cfg = BatonConfig.model_validate(cfg)
        self.role = role
        self.pool = "prefill" if role == "prefill" else "decode"
        tracing.setup(self.cfg.tracing, f"baton-{role}", REPO_ROOT)
        self.replica = replica_id()
        self.servers: list = []
        self.metrics = None
        self.in_flight = 0
        self.in_flight_alive = 0  # of those, the ones that arrived while the engine lived
        self.died_at: float | None = None  # when `_watch_engine` saw the engine die (monotonic)
        self.signals = SignalMeter()
        self.batch_runner = None  # a front's Batch API runner
        self.tasks: list[asyncio.Future] = []
        self.heartbeat = None
        self._watch_task = None  # `_watch_engine`
        self.leases = None
        self.keys = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="baton-engine-loop", daemon=True)
        self.thread.start()
        timeout = getattr(self.cfg, self.pool).start_timeout_s
        started = asyncio.run_coroutine_threadsafe(self._start(), self.loop)
        try:
            started.result(timeout)
        except concurrent.futures.TimeoutError:
            started.cancel()
            raise RuntimeError(f"{role} replica {self.replica}: engine not serving after {timeout:.0f} s "
                               f"({self.pool}.start_timeout_s); Serve replaces this replica") from None

    async def _start(self) -> None:
        from deployments.front.internal import internal_app
        import aiohttp

        core_fence.unfence()  # Ray may have started this process on the stack's fenced CPUs
        quota = getattr(self.cfg, self.pool).resources.cpu_quota
        if quota is not None:  # this process and the engine it starts: `quota` cores together
            self.cpu_slice = cpu_slice.CpuSlice(f"replica-{self.replica}")
            self.cpu_slice.limit(quota)
            self.cpu_slice.join()
        if self.cfg.models:  # a catalogue: one engine per resident model (deployments/catalogue/model_host.py)
            from deployments.catalogue.model_host import ModelHost

            self.engine = ModelHost(self.cfg, self.replica, _internal_host(self.cfg.serve.internal_host))
        else:
            if not getattr(self.cfg, self.pool).resources.num_gpus:
                from actors.fast_start import use_standby

                use_standby(cold=False)  # the engine core forks with vLLM imported, not importing it again
            self.engine = EngineApp(self.cfg, self.role, self.replica, _internal_host(self.cfg.serve.internal_host))
        await self.engine.start()
        # The front, Ray's threads and the EngineCore off the cores vLLM bound its worker to (not
        # a catalogue's: it starts engines later, whose workers must see every core).
        cores = core_fence.fence(core_fence.tree(os.getpid())) if not self.cfg.models else set()
        if cores:
            logger.info("replica %s: front and engine loop moved to cores %s", self.replica, sorted(cores))
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300))
        s = self.cfg.serve
        inner = listen_socket(_internal_host(s.internal_host), 0, reuse_port=False)
        host, port = inner.getsockname()[:2]
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
        finished = Finisher(self.engine.direct, self.replica) if not self.cfg.models else self.engine
        front = None
        if self.role != "prefill":
            front = self._front(finished)
        self._serve(internal_app(self.engine, finished, self.metrics), inner)
        if front is not None:
            await self.leases.start()
            await self.keys.start()
            self._serve(front, listen_socket(*s.front_bind(), reuse_port=True), public=True)
            front.sites.start()
            self.batch_runner.start()
            # its loop's lag, in its metrics and in its admission's permits
            limit = self.leases.limit
            self._lag_task = asyncio.ensure_future(loop_lag.tick(on_lag=limit.observe if limit else None))
        self.engine_load: dict = await self.engine.engine_load()
        self._load_task = asyncio.ensure_future(self._refresh_load())
        self.heartbeat = Heartbeat(self.cfg, self.pool, self.replica, {
            "capacity_blocks": self.engine.capacity_blocks, "url": self.url,
            "events_replay": self.engine.events_replay},
            load=self._load)
        if not self.cfg.models:  # a catalogue's engines die and wake one by one (model_host.py)
            self._watch_task = asyncio.ensure_future(self._watch_engine())
        gc_pauses.space_out()  # fewer young collections (deployments/gc_pauses.py)
        gc_pauses.watch()  # the collector's pauses, in the front's metrics

    async def _watch_engine(self) -> None:
        """Takes this replica out of routing once its engine died (its engine core crashed alone):
        out of the registry, so no router sends it anything new; its own front already routes
        elsewhere (pipeline/route.py: `Routed` forgets this replica, `Unrouted` spills to its
        peers, to which `_running` stops offering it). Serve replaces the replica at its next
        health check (`check_health`); until then its clients get answers, not 503s."""
        while not self.engine.errored():
            await asyncio.sleep(ENGINE_WATCH_S)
        self.died_at = time.monotonic()
        logger.warning("replica %s: its engine died; out of the registry, its front forwards to the other "
                       "replicas until Serve replaces it", self.replica)
        await asyncio.to_thread(self.heartbeat.stop)

    def _running(self) -> int | None:
        """Requests in this replica's engine; None once it died (permit_leases then publishes no URL
        for the other fronts to spill to)."""
        return None if self.engine.errored() else self.engine.running()

    def _load(self) -> dict:
        """What the next heartbeat reports: the engine's load, and its speculation where it has any."""
        spec = getattr(self.engine, "spec", None)
        return {**self.engine_load, "unfinished": self.engine.running(), **(spec.summary() if spec else {})}

    async def _refresh_load(self) -> None:
        """Keeps `engine_load` (what the next heartbeat reports) as fresh as the heartbeat."""
        while True:
            await asyncio.sleep(self.cfg.routing.heartbeat_s / 2)
            self.engine_load = await self.engine.engine_load()

    def _front(self, finished: Finisher):
        """The public front; also makes `finished` count answers in its metrics."""
        from deployments.admission import Admission, AsyncAdmission, lag_limit
        from deployments.api.api_keys import KeyStore
        from deployments.batch.batch_runner import BatchRunner
        from deployments.front.front import Front
        from deployments.front.metrics import IngressMetrics, kv_bytes_per_token
        from deployments.admission.permit_leases import PermitLeases
        from deployments.front.readiness import Readiness
        from deployments.front.request_routing import RequestRouting

        from deployments.front.metrics_scrape import EngineSeries

        # Permits per replica: unset, the engine's own limit on a GPU (common/config/admission.py).
        self.cfg = self.cfg.model_copy(update={
            "admission": self.cfg.admission.resolved(getattr(self.engine, "seqs_limit", None))})
        self.metrics = metrics = IngressMetrics()
        metrics.registry.register(EngineSeries(self.replica))  # vLLM's own series, this replica's
        if getattr(self.engine, "spec", None) is not None:  # speculation's acceptance, in /metrics
            from actors.spec_stats import SpecCollector

            metrics.registry.register(SpecCollector(self.engine.spec, self.pool))
        bs = self.cfg.model.block_size
        kv_bytes = kv_bytes_per_token(self.cfg.model.resolved_path(), self.cfg.model.dtype)
        finished.on_usage = lambda *answer: metrics.record_usage(*answer, bs, kv_bytes)  # info, usage, tenant, model
        # Routing reads and writes (pins, session sets and in-flight counts are idempotent; a
        # placement sent twice takes one more ticket and may count the session on a second
        # replica until the set's TTL), readiness and key reads: a connection Redis closed by
        # restarting is retried once instead of turning the request into a fallback route.
        client = self.cfg.redis.client(asynchronous=True, reconnect=True, socket_timeout=5)
        routing = RequestRouting(self.cfg, client, self.metrics, self.replica) if self.cfg.routes() else None
        # Any front may send to any decode replica's engine, so the fronts lease
        # the pool's permits from Redis (deployments/admission/permit_leases.py).
        gate = AsyncAdmission(Admission(self.cfg.admission, replicas=1))
        readiness = Readiness(self.cfg, client, self.engine)
        self.keys = KeyStore(self.cfg.serve.api_keys, client)
        if self.cfg.models:
            self.engine.metrics = metrics
        peers = functools.partial(readiness.registry.live, "decode")  # the live decode replicas' entries
        features = self._features(gate, client, peers)
        front = Front(self.cfg, self.replica, self.engine, finished, routing, gate, self.metrics, self.http,
                      readiness.check, peers, self.keys.table, features)
        self.batch_runner = BatchRunner(self.cfg, features.batches.store, gate, front)
        # Unrouted colocated: a full engine spills to a peer (not a catalogue's: its peers may not have the model).
        colocated = routing is None and not self.cfg.models
        # A client of their own: a renewal that times out drops its connection,
        # which must not be one a routing read is using.
        self.leases = PermitLeases(self.cfg.redis.client(asynchronous=True, socket_timeout=1),
                                   self.replica, self.cfg.admission, gate,
                                   engine=(self.url, self._running) if colocated else None,
                                   on_peers=front.spill_view if colocated else None,
                                   limit=lag_limit.from_config(self.cfg.admission))
        return front

    def _features(self, gate, client, peers):
        """The front's optional features (deployments/front/front.py `Features`): a catalogue's engines
        and their routing, the sites' link, and the APIs whose state is in Redis: batches (their lines
        run by every front) and stored responses."""
        from deployments.api.response_store import ResponseStore
        from deployments.api.responses_api import ResponsesAPI
        from deployments.batch.batch_api import BatchAPI
        from deployments.batch.batch_store import BatchStore
        from deployments.front.front import Features

        r = self.cfg.responses
        f = Features(batches=BatchAPI(self.cfg, BatchStore(client)),
                     responses=ResponsesAPI(ResponseStore(client, r.store_ttl_s, r.max_stored_bytes)))
        if self.cfg.models:  # which replica runs a catalogue request (deployments/catalogue/model_routing.py)
            from deployments.catalogue.model_routing import ModelRouting

            f.models = self.engine
            f.model_routing = ModelRouting(self.replica, peers, client, self.cfg.routing.pin_ttl_s)
        if self.cfg.sites.enabled:  # routing across sites (deployments/sites/site_link.py)
            from deployments.sites.site_link import SiteLink

            f.sites = SiteLink(self.cfg, gate, self.http, self.metrics)
        return f

    def _serve(self, app, sock: socket.socket, public: bool = False) -> None:
        server, task = serve_asgi(self._counting(app, public), sock)
        self.servers.append(server)
        self.tasks.append(task)

    def _counting(self, app, public: bool):
        """`app`, counting the HTTP requests in flight and the arrivals (for autoscaling);
        `public`: the clients' front, whose inference requests are the pool's arrivals."""
        async def counted(scope, receive, send):
            if scope["type"] != "http" or scope["path"] in ("/health", "/metrics", "/baton/metrics"):
                return await app(scope, receive, send)
            self.signals.arrived(scope["path"], public)
            alive = self.died_at is None
            self.in_flight += 1
            self.in_flight_alive += alive
            try:
                await app(scope, receive, send)
            finally:
                self.in_flight -= 1
                self.in_flight_alive -= alive
        return counted

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metrics (deployments/autoscaling/autoscaling.py): in flight, arrivals,
        the front's interval means and the batch work its Batch API runner holds. Moves the meter's
        interval baseline."""
        return self.signals.report(time.monotonic(), self.in_flight, self.metrics,
                                   batch=self.batch_runner.backlog if self.batch_runner is not None else None)

    async def check_health(self) -> None:
        """Serve's health probe: raises if the engine or a server died. A dead engine's replica
        stays up while requests it took before the death still run (`_relaying`)."""
        if self.engine.errored() and not self._relaying():
            raise RuntimeError(f"engine of {self.role} replica {self.replica} is dead")
        if any(t.done() for t in self.tasks):
            raise RuntimeError(f"an HTTP server of {self.role} replica {self.replica} stopped")

    def _relaying(self) -> bool:
        """Whether requests that arrived while the engine lived still run, for at most the request
        deadline after its death. Its front placed them again on other replicas and relays their
        answers (pipeline/dispatch.py); stopping this process would cut those answers, which the
        client then sees as errors (or HAProxy runs again from the start). Nothing new is routed
        here meanwhile: the replica is out of the registry."""
        died = self.died_at if self.died_at is not None else time.monotonic()
        return self.in_flight_alive > 0 and time.monotonic() - died < self.cfg.serve.request_timeout_s

    def __del__(self):  # also runs when the constructor failed half-way
        if getattr(self, "heartbeat", None) is not None:
            self.heartbeat.stop()  # out of the registry: routers send it nothing new
        for task in (getattr(self, "_load_task", None), getattr(self, "_watch_task", None)):
            if task is not None:
                self.loop.call_soon_threadsafe(task.cancel)
        if not drain(getattr(self, "servers", ()), getattr(self, "tasks", ()), DRAIN_S):
            logger.warning("replica %s: %d HTTP requests still running after %.0f s; stopping the engine",
                           getattr(self, "replica", "?"), getattr(self, "in_flight", 0), DRAIN_S)
        if getattr(self, "leases", None) is not None and self.loop.is_running():
            try:  # give the permits back now rather than after the lease TTL
                asyncio.run_coroutine_threadsafe(self.leases.stop(), self.loop).result(1)
            except Exception:  # noqa: BLE001 - shutting down anyway
                pass
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
        if getattr(self, "cpu_slice", None) is not None:
            self.cpu_slice.close()
