"""The public HTTP front of a decode (or colocated) engine replica.

Every decode replica listens on the public port (SO_REUSEPORT, so the kernel spreads connections
over the replicas of a node) and runs this front before its own vLLM OpenAI app. Chat completions,
completions, Responses and Anthropic Messages (deployments/api/apis.py: every route that reaches an
engine; any other is a 404) take one path:
1. the API key (tenant), the body against the API's strict schema (unknown
   fields are 400s, in the API's own error shape) and the model;
2. an engine permit from the tenant's fair queue, or a 429;
3. routes: unrouted colocated runs here (or, when this engine is full and
   the front holds more of the pool's permits than it can run, on a peer's
   engine); disaggregated and routed colocated (routing.colocated_router)
   render the prompt once (vLLM's template) and ask the routing policy for
   a decode replica and, disaggregated, a prefill replica, which computes
   the KV into Mooncake;
4. runs decode in this process when the policy chose this replica, else
   forwards the bytes to the chosen replica's internal server; a replica
   that fails before the request's first token costs a retry here.
With a model catalogue, step 3 is the requested model's engine here, woken
if cold (deployments/catalogue/model_host.py). The tenant becomes vLLM's `cache_salt`;
chat and Messages prompt ids travel in `kv_transfer_params.prompt_token_ids`,
so no process tokenises them twice. A Responses chain is resolved here
(deployments/api/responses_api.py), so the engine sees a stateless request.
"""
from __future__ import annotations

import json
import logging
import time
import uuid

import redis

from actors.finisher import INFO_HEADER, ask_usage, error_code, header, usage_headers
from common import tracing
from common.config import BatonConfig
from common.constants import REQUEST_ID_HEADER, SESSION_HEADER
from common.response import BatonInfo
from deployments.api import apis
from deployments.front import first_token, relay
from deployments.admission import AsyncAdmission, Shed
from deployments.api.api_keys import KeyTable
from deployments.api.bodies import check_length, read_body, respond, small_body  # noqa: F401 - respond: re-exported
from deployments.front.metrics import IngressMetrics
from deployments.front.metrics_scrape import pool_metrics
from deployments.catalogue.model_routing import prefix_keys
from deployments.api.request_headers import deadline_of, tenant_of, tier_of
from deployments.front.request_routing import RequestRouting, Route
from deployments.api.response_store import ResponseCapture, input_items
from deployments.api.schemas import APIError
from routing.policy.spill import SpillChooser

logger = logging.getLogger(__name__)
_ID_PREFIX = {"chat": "chatcmpl", "text": "cmpl", "messages": "msg"}


class Front:
    """ASGI app: the public endpoint of one replica (see the module docstring)."""

    def __init__(self, cfg: BatonConfig, replica: str, engine, local_app, routing: RequestRouting | None,
                 gate: AsyncAdmission, metrics: IngressMetrics, session, readiness, peers, keys: KeyTable,
                 models=None):
        self.cfg, self.replica, self.engine, self.local = cfg, replica, engine, local_app
        self.models = models  # a catalogue's engines (deployments/catalogue/model_host.py); None: one model
        self.keys = keys
        self.routing, self.gate, self.metrics, self.http = routing, gate, metrics, session
        self.readiness = readiness  # async () -> (ready, why)
        self.peers = peers  # async () -> live decode replicas' registry entries
        self.model = cfg.model.served_name
        self.spill = SpillChooser(cfg.admission.capacity)  # colocated only
        self.peer_urls: dict[str, str] = {}
        self.sites = None  # deployments/sites/site_link.py, when `sites.peers` are configured
        self.model_routing = None  # deployments/catalogue/model_routing.py, with a catalogue
        self.batches = None  # deployments/batch/batch_api.py: /v1/files and /v1/batches
        self.responses = None  # deployments/api/responses_api.py: stored responses and chains
        metrics.before_render = self.admission_gauges

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        try:
            if (api := apis.APIS.get(path)) is not None and method == "POST":
                return await self._completion(scope, receive, send, api)
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
            if path.startswith("/baton/site") and self.sites is not None and self.sites.authorised(scope):
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
                if self.models is not None:
                    return await respond(send, 200, {"object": "list", "data": self.models.listing()})
            if path in apis.LOCAL_ROUTES:  # no engine step and no tenant data (deployments/api/apis.py)
                return await self.local(scope, receive, send)
            raise APIError(404, f"no route {method} {path}", code="not_found")  # default deny
        except APIError as exc:
            await respond(send, exc.status, apis.error_body(exc, apis.shape_of(path)), exc.headers)
        except ConnectionError:
            return
        except Exception as exc:  # noqa: BLE001 - a bug here still answers, in its API's shape, and is logged
            logger.exception("front: %s %s failed", method, path)  # the traceback, never the body
            try:
                err = APIError(500, f"internal error: {type(exc).__name__}", "server_error")
                await respond(send, 500, apis.error_body(err, apis.shape_of(path)))
            except Exception:  # noqa: BLE001 - the response had already started
                pass

    async def metrics_text(self) -> bytes:
        """This replica's metrics summed with every other live decode replica's, and the indexer's."""
        redis_client = self.routing.redis if self.routing is not None else None
        return await pool_metrics(self.metrics, self.replica, await self.peers(), self.http, redis_client)

    def admission_gauges(self) -> None:
        """Sets this front's admission estimates and permit count in its metrics."""
        adm, m = self.gate.admission, self.metrics
        m.estimates.labels(self.replica, "service").set(adm.queue.service_time_s or 0.0)
        m.estimates.labels(self.replica, "start").set(adm.start_time_s or 0.0)
        m.leased.labels(self.replica).set(adm.permits.capacity)

    # -- request preparation -------------------------------------------------

    def _parse(self, api: apis.Api, raw: bytes) -> dict:
        """The validated body as a dict; APIError(4xx) when it is not acceptable."""
        body = apis.parse(api, raw)
        model = body["model"]
        if model != self.model and (self.models is None or not self.models.known(model)):
            raise APIError(404, f"The model '{model}' does not exist", param="model", code="model_not_found")
        return body

    # -- the request path -----------------------------------------------------

    async def _completion(self, scope, receive, send, api: apis.Api) -> None:
        kind = api.kind
        forwarded = self.sites.forwarded_tenant(scope) if self.sites is not None else None
        # A batch line (deployments/batch/batch_runner.py) carries its tenant in the scope, set in-process only.
        tenant = scope.get("baton.tenant") or forwarded or tenant_of(scope, self.cfg.serve, self.keys)
        limit = self.cfg.serve.max_body_bytes
        await check_length(scope, receive, limit)
        raw = None
        if self.sites is not None and forwarded is None and "baton.tenant" not in scope:  # site_link.py
            done, raw = await self.sites.offload(scope, receive, send, tenant, lambda b: self._parse(api, b))
            if done:
                return
        if not api.generates:  # count_tokens: the template and tokenizer only, no engine step or permit
            self._parse(api, raw := raw if raw is not None else await read_body(receive, limit))
            return await relay.run_local(self.local, scope, raw, receive, send, [], lambda _timing: None)
        # Admission first: a refused request costs no body read, no parse, no
        # tokenising; a queued one waits with its body unread.
        extra = self.sites.turn_places(scope, forwarded is not None) if self.sites is not None else 0
        permit = await self._admit(tenant, tier_of(scope, self.cfg.admission.tiers), deadline_of(scope),
                                   small_body(scope), extra)
        try:
            body = self._parse(api, raw if raw is not None else await read_body(receive, limit))
            session = apis.session_of(api, header(scope["headers"], SESSION_HEADER.encode()), body)
            if kind == "responses":
                session = await self.responses.chain(body, tenant, session)
        except BaseException:
            self._release(permit, tenant)
            raise
        body["cache_salt"] = tenant
        if kind == "responses" and body.get("store") is not False:  # kept for previous_response_id
            capture = ResponseCapture(send)
            turn = input_items(body["input"])
            await self._serve(scope, receive, capture, kind, body, tenant, permit, session)
            return await self.responses.keep(tenant, capture.response, turn, session)
        await self._serve(scope, receive, send, kind, body, tenant, permit, session)

    async def _serve(self, scope, receive, send, kind: str, body: dict, tenant: str, permit, session) -> None:
        """Runs an admitted, parsed request on its model's engine: here, or a catalogue's peer's."""
        if self.models is None:
            return await self._run(scope, receive, send, kind, body, tenant, permit, self.local, session=session)
        prefixes = None if session else prefix_keys(tenant, body)
        if peer := await self.model_routing.peer(body["model"], session, self.models.resident_here(body["model"]),
                                                 prefixes):
            # Its session's replica or a peer has it resident: it runs there (here, woken, if that peer fails).
            return await self._run(scope, receive, send, kind, body, tenant, permit, self.models, peer,
                                   session=session)
        local = await self._model_app(body["model"], scope, permit, tenant)
        try:
            await self._run(scope, receive, send, kind, body, tenant, permit, local, session=session)
        finally:
            self.models.release(body["model"])

    async def _run(self, scope, receive, send, kind: str, body: dict, tenant: str, permit, local,
                   route: Route | None = None, session: str | None = None) -> None:
        """Routes (unless `route` says where) and answers one admitted, parsed request; `local` is the
        app of its model here, `session` its session key (apis.session_of)."""
        rid = body.setdefault("request_id", uuid.uuid4().hex)  # a Responses request's is its response id
        request_id = rid if kind == "responses" else f"{_ID_PREFIX.get(kind, 'cmpl')}-{rid}"
        extra = [(REQUEST_ID_HEADER.encode(), request_id.encode())]
        if session:
            extra.append((SESSION_HEADER.encode(), session.encode()))
        with tracing.tracer().start_as_current_span("ingress") as span:
            span.set_attribute("baton.request_id", request_id)
            info = BatonInfo()
            stream = relay.EarlyStream(send, extra)
            try:
                if route is None:
                    route = await self._route(kind, body, tenant, session, info, request_id, stream)
                else:
                    info.route, info.decode_only = route.reason, True
            except BaseException:
                self._release(permit, tenant)
                raise
            span.set_attribute("baton.route", info.route or "")
            done = self._on_done(permit, tenant, route)
            try:
                await self._dispatch(scope, receive, stream, body, info, route, request_id, extra, done, tenant,
                                     local, kind)
            finally:
                done(None)  # idempotent: frees whatever a cancelled or failed dispatch still holds

    async def _route(self, kind: str, body: dict, tenant: str, session: str | None,
                     info: BatonInfo, request_id: str, stream: relay.EarlyStream) -> Route | None:
        if self.routing is None:  # unrouted colocated: this replica serves it, unless its engine is full
            info.route, info.decode_only = "colocated", True
            route = self._spill_route()
            if route is not None:
                info.route = route.reason
            return route
        try:
            t0 = time.perf_counter()
            ids = await self.engine.prompt_ids(kind, body)
            self.metrics.render_s.observe(time.perf_counter() - t0)
        except ValueError as exc:
            raise APIError(400, str(exc), code=error_code(400, str(exc))) from None
        # vLLM's chat renderer (a Messages request's too) takes these ids instead of templating
        # again; a completion prompt simply becomes the ids; a Responses request renders again.
        if kind in ("chat", "messages"):
            body["kv_transfer_params"] = {"prompt_token_ids": ids}
        elif kind == "text":
            body["prompt"] = ids
        try:
            t0 = time.perf_counter()
            route = await self.routing.route(ids, tenant, session)
            self.metrics.route_s.observe(time.perf_counter() - t0)
        except redis.RedisError:  # Redis slow or away: decode computes the prompt, counted
            route = Route(None, None, True, "fallback", 0)
            self.metrics.decisions.labels("decode", "fallback").inc()
        info.route, info.decode_only = route.reason, route.decode_only
        info.predicted_cached_tokens = route.predicted_cached_tokens
        info.predicted_s, info.stay_s, info.moved = route.predicted_s, route.stay_s, route.moved or None
        self.routing.started(route)
        if not route.decode_only:
            if route.prefill_url:
                lead = self.cfg.routing.prefill_first_token and first_token.eligible(kind, body)
                await self._prefill(route, ids, tenant, info, request_id, body if lead else None, stream)
            else:  # a registry entry without a URL: decode computes the prompt
                info.decode_only = True
        return route

    async def _model_app(self, model: str, scope, permit, tenant: str):
        """`model`'s app here, woken if cold; a 429 (permit released) if it cannot load by the deadline."""
        try:
            return await self.models.acquire(model, deadline_of(scope) or self.cfg.admission.default_deadline_s)
        except BaseException:
            self._release(permit, tenant)
            raise

    def _spill_route(self) -> Route | None:
        """Colocated: a peer's engine for this request when this one is full (routing/policy/spill.py)."""
        peer = self.spill.choose(self.engine.running())
        if peer is None or peer not in self.peer_urls:
            return None
        self.spill.started(peer)
        return Route(peer, None, True, "spill", 0, in_flight={"spill"}, decode_url=self.peer_urls[peer])

    def spill_view(self, peers: dict) -> None:
        """The other colocated fronts' engines (permit_leases.Peer), after a lease renewal."""
        self.peer_urls = {f: p.url for f, p in peers.items()}
        self.spill.update({f: p.running for f, p in peers.items()})

    async def _prefill(self, route: Route, ids: list[int], tenant: str, info: BatonInfo,
                       request_id: str, lead: dict | None, stream: relay.EarlyStream) -> None:
        """Runs the prompt on the prefill replica; on failure decode computes it. `lead`: the body of
        a request that may stream the prefill's token as its first (deployments/front/first_token.py);
        the body then becomes decode's part."""
        payload = {"prompt_token_ids": ids, "cache_salt": tenant, "request_id": request_id,
                   "lookup": route.prefill_lookup, "trace": tracing.inject()}
        if lead is not None:
            payload["first_token"] = first_token.sampling(lead)

        async def on_first(token: dict) -> None:
            if first_token.usable(token):
                first_token.continue_body(lead, ids, token["token_id"])
                info.first_token = "prefill"
                await stream.begin(first_token.first_events(request_id, self.model, token["text"]))

        try:
            res = await relay.post_json(self.http, f"{route.prefill_url}/baton/prefill", payload,
                                        self.cfg.serve.request_timeout_s, on_first)
            info.prefill_cached_tokens = int(res["cached_tokens"])
            info.prefill_replica = route.prefill_replica
        except Exception as exc:  # noqa: BLE001 - decode recomputes the prompt
            info.retried_after = f"prefill {type(exc).__name__}"
            info.decode_only = True
        finally:
            self.routing.prefill_done(route)

    async def _dispatch(self, scope, receive, send, body: dict, info: BatonInfo, route: Route | None,
                        request_id: str, extra: list, done, tenant: str, local, kind: str = "chat") -> None:
        # Whose answer it is, for the Finisher's usage counters; chat and completion streams always
        # ask vLLM for usage (Responses and Messages streams report it anyway).
        bill = usage_headers(tenant, body["model"], kind in ("chat", "text") and ask_usage(body))
        raw = json.dumps(body).encode()
        remote = route is not None and route.decode_replica != self.replica and route.decode_url
        on_first = (lambda: self.routing.computed(route)) if route is not None and self.routing is not None else None
        trace = tracing.inject()
        if remote:
            headers = {"content-type": "application/json", INFO_HEADER.decode(): json.dumps(info.body()),
                       REQUEST_ID_HEADER: request_id, **trace, **{k.decode(): v.decode() for k, v in bill}}
            for k, v in scope["headers"]:
                if k in (SESSION_HEADER.encode(), b"authorization"):
                    headers[k.decode()] = v.decode()
            try:
                await relay.run_remote(self.http, f"{route.decode_url}{scope['path']}", raw, headers, send, extra,
                                       done, self.cfg.serve.request_timeout_s, on_first)
                return
            except relay.UpstreamUnavailable as exc:
                info.retried_after = str(exc).split(":")[0]
                self.metrics.retries.inc()
        inner = dict(scope)
        inner["headers"] = [(k, v) for k, v in scope["headers"]
                            if k not in (b"content-length", b"content-type", b"x-request-id", INFO_HEADER, *dict(bill))]
        inner["headers"] += [(b"content-length", str(len(raw)).encode()),
                             (b"content-type", b"application/json"),
                             (INFO_HEADER, json.dumps(info.body()).encode()),
                             (REQUEST_ID_HEADER.encode(), request_id.encode()), *bill]
        inner["headers"] += [(k.encode(), v.encode()) for k, v in trace.items()]
        await relay.run_local(local, inner, raw, receive, send, extra, done, on_first)

    # -- admission and accounting ----------------------------------------------------

    async def _admit(self, tenant: str, tier: str | None, deadline_s: float | None, close: bool,
                     extra_queue: int = 0):
        """A permit, or APIError 429 (``extra_queue``: places beyond the queue's bounds, a session's
        turn at its site, deployments/sites/site_link.py). ``close``: a refusal also closes the connection,
        so the client's next request may reach another replica (a replica that refuses fast would
        otherwise get ever more traffic over kept-alive connections while its peers sit on streams)."""
        waited = time.monotonic()
        try:
            permit = await self.gate.acquire(tenant, tier, deadline_s, extra_queue)
        except Shed as exc:
            self.metrics.shed.labels(tenant, exc.reason).inc()
            headers = {**exc.headers, "Connection": "close"} if close else exc.headers
            raise APIError(429, f"Baton is at capacity ({exc.reason}); retry after "
                                f"{exc.retry_after_s} s", "rate_limit_error", code=exc.reason,
                           headers=headers) from None
        self.metrics.queue.observe(time.monotonic() - waited)
        self.metrics.admitted.labels(tenant).inc()
        self.metrics.permits.labels(tenant).inc()
        return permit

    def _release(self, permit, tenant: str) -> None:
        if not permit.released:
            permit.release()
            self.metrics.permits.labels(tenant).dec()

    def _on_done(self, permit, tenant: str, route: Route | None):
        """The callback that ends a request: permit, in-flight counts, latency.

        Safe to call more than once: permits and in-flight counts are freed
        once; latency is recorded by the relay's call, which has a timing.
        """
        def done(timing: relay.Timing | None) -> None:
            self._release(permit, tenant)
            if route is not None and self.routing is not None:
                self.routing.prefill_done(route)
                self.routing.finished(route)
            elif route is not None and "spill" in route.in_flight:
                route.in_flight.discard("spill")
                self.spill.finished(route.decode_replica)
            if timing is None or timing.status != 200:
                return
            if timing.first_body is not None and timing.events and permit.ticket.admitted_at is not None:
                self.gate.observe_start(timing.first_body - permit.ticket.admitted_at)
            m = self.metrics
            m.e2e.observe(timing.ended - timing.started)
            if timing.first_body is not None:
                m.ttft.observe(timing.first_body - timing.started)
                if timing.events > 3:
                    m.tpot.observe((timing.ended - timing.first_body) / (timing.events - 3))
        return done
