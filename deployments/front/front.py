"""The public HTTP front of a decode (or colocated) engine replica.

Every decode replica listens on the public port (SO_REUSEPORT, so the kernel spreads connections
over the replicas of a node) and runs this front before its own vLLM OpenAI app. Completion
requests (chat, completions, Responses, Anthropic Messages: deployments/api/apis.py) take the
request pipeline (deployments/front/pipeline/flow.py: auth, admission, parse, model, route,
prefill, dispatch, finish); this module answers the other routes (health, metrics, stored
responses, batches, the sites' probes, the engine's own read-only routes) and 404s the rest.
Optional features (other sites, a model catalogue, KV-aware routing) are chosen once, here.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import redis

from common.config import BatonConfig
from deployments.admission import AsyncAdmission
from deployments.api import apis
from deployments.api.api_keys import KeyTable
from deployments.api.bodies import respond
from deployments.api.request_headers import tenant_of
from deployments.api.schemas import APIError
from deployments.front.metrics import IngressMetrics
from deployments.front.metrics_scrape import pool_metrics
from deployments.front.pipeline.admit import Admit
from deployments.front.pipeline.auth import Auth, NoSites
from deployments.front.pipeline.dispatch import Dispatch
from deployments.front.pipeline.finish import Finish
from deployments.front.pipeline.flow import Pipeline
from deployments.front.pipeline.models import Catalogue, OneModel
from deployments.front.pipeline.parse import Parse
from deployments.front.pipeline.prefill import Prefill
from deployments.front.pipeline.route import Routed, Unrouted
from deployments.front.request_routing import RequestRouting

logger = logging.getLogger(__name__)


@dataclass
class Features:
    """A front's optional features, each chosen once: `sites` (deployments/sites/site_link.py, when
    `sites.peers` are configured), a catalogue's engines (`models`, deployments/catalogue/model_host.py)
    and their routing (`model_routing`), the Batch API (`batches`) and stored responses (`responses`)."""

    sites: object = field(default_factory=NoSites)
    models: object = None
    model_routing: object = None
    batches: object = None
    responses: object = None


class Front:
    """ASGI app: the public endpoint of one replica (see the module docstring)."""

    def __init__(self, cfg: BatonConfig, replica: str, engine, local_app, routing: RequestRouting | None,
                 gate: AsyncAdmission, metrics: IngressMetrics, http, readiness, peers, keys: KeyTable,
                 features: Features | None = None):
        f = features or Features()
        self.cfg, self.replica, self.keys, self.gate, self.metrics = cfg, replica, keys, gate, metrics
        self.readiness = readiness  # async () -> (ready, why)
        self.peers = peers  # async () -> live decode replicas' registry entries
        self.http, self.sites, self.batches, self.responses = http, f.sites, f.batches, f.responses
        self.local = local_app  # the engine's own app: its read-only routes
        name = cfg.model.served_name
        self.models = (Catalogue(name, f.models, f.model_routing, cfg.admission.default_deadline_s)
                       if f.models is not None else OneModel(name, local_app))
        self.placement = (Routed(routing, engine, metrics) if routing is not None
                          else Unrouted(engine, cfg.admission.capacity))
        self.pipeline = Pipeline(
            Auth(cfg.serve, keys, self.sites), Admit(gate, metrics, cfg.admission.tiers, self.sites),
            Parse(self.models.known, self.responses), self.models, self.placement,
            Prefill(cfg, http, name, self.placement),
            Dispatch(replica, http, cfg.serve.request_timeout_s, metrics, self.placement, lambda: engine.errored()),
            Finish(gate, metrics, self.placement, self.models), self.responses, local_app)
        metrics.before_render = self.admission_gauges

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        try:
            if (api := apis.APIS.get(path)) is not None and method == "POST":
                return await self.pipeline(scope, receive, send, api)
            if path.startswith("/v1/responses/"):
                return await self.responses.stored(scope, send, tenant_of(scope, self.cfg.serve, self.keys))
            if path == "/health":
                ready, why = await self.readiness()
                return await respond(send, 200 if ready else 503, {"status": "ok" if ready else why},
                                     None if ready else {"Retry-After": 5})
            if path == "/metrics":
                return await respond(send, 200, await self.metrics_text(), content_type=b"text/plain")
            if path == "/openapi.json":
                return await respond(send, 200, apis.openapi_document())
            if path.startswith("/baton/site") and self.sites.authorised(scope):
                if path == "/baton/site":  # a peer site's probe
                    return await respond(send, 200, self.sites.answer())
                if path == "/baton/site/policy" and method == "PUT":
                    return await respond(send, 200, await self.sites.switch_policy(receive))
            if self.batches is not None and path.startswith(("/v1/files", "/v1/batches")):
                return await self.batches.handle(scope, receive, send, tenant_of(scope, self.cfg.serve, self.keys))
            tenant_of(scope, self.cfg.serve, self.keys)
            if path == "/v1/models":
                ready, why = await self.readiness()
                if not ready:
                    raise APIError(503, f"Baton is starting: {why}", "server_error",
                                   code="starting", headers={"Retry-After": "5"})
                if (listing := self.models.listing()) is not None:  # a catalogue's
                    return await respond(send, 200, {"object": "list", "data": listing})
            if path in apis.LOCAL_ROUTES:  # no engine step and no tenant data (deployments/api/apis.py)
                return await self.local(scope, receive, send)
            raise APIError(404, f"no route {method} {path}", code="not_found")  # default deny
        except APIError as exc:
            await respond(send, exc.status, apis.error_body(exc, apis.shape_of(path)), exc.headers)
        except ConnectionError:
            return
        except redis.RedisError as exc:  # Redis restarting (`baton up` restarts it within seconds)
            logger.warning("front: %s %s: Redis unavailable (%s)", method, path, type(exc).__name__)
            await _late(send, path, APIError(503, "Baton's state store is unavailable; retry", "server_error",
                                             code="store_unavailable", headers={"Retry-After": "1"}))
        except Exception as exc:  # noqa: BLE001 - a bug here still answers, in its API's shape, and is logged
            logger.exception("front: %s %s failed", method, path)  # the traceback, never the body
            await _late(send, path, APIError(500, f"internal error: {type(exc).__name__}", "server_error"))

    async def metrics_text(self) -> bytes:
        """This replica's metrics summed with every other live decode replica's, and the indexer's."""
        return await pool_metrics(self.metrics, self.replica, await self.peers(), self.http, self.placement.redis)

    def admission_gauges(self) -> None:
        """Sets this front's admission estimates and permit count in its metrics."""
        adm, m = self.gate.admission, self.metrics
        m.estimates.labels(self.replica, "service").set(adm.queue.service_time_s or 0.0)
        m.estimates.labels(self.replica, "start").set(adm.start_time_s or 0.0)
        m.leased.labels(self.replica).set(adm.permits.capacity)

    def spill_view(self, peers: dict) -> None:
        """The other colocated fronts' engines (permit_leases.Peer), after a lease renewal."""
        self.placement.spill_view(peers)


async def _late(send, path: str, err: APIError) -> None:
    """Answers `err` in the route's API shape, unless the response had already started."""
    try:
        await respond(send, err.status, apis.error_body(err, apis.shape_of(path)), err.headers)
    except Exception:  # noqa: BLE001 - the response had already started
        pass
