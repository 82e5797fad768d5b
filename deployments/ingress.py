"""The OpenAI-compatible HTTP ingress, a Ray Serve deployment over FastAPI.

For each request it resolves the tenant from the API key, applies the chat
template, checks the context budget, then runs prefill on a prefill replica
(KV goes to Mooncake) and streams decode from a decode replica (KV comes back
from Mooncake). In colocated mode there is no prefill pool and decode does
both. Bad input is answered with a 4xx before any engine is touched.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from typing import AsyncIterator

from fastapi import FastAPI, Request
import redis
import redis.asyncio
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from ray import serve

from actors.protocol import EngineChunk, EngineRequest, SamplingSpec
from common import tracing
from common.config import BatonConfig
from common.constants import DEADLINE_HEADER, DEFAULT_TENANT, REPO_ROOT, REQUEST_ID_HEADER, SESSION_HEADER
from deployments import render
from deployments.admission import Admission, AsyncAdmission, Shed
from deployments.metrics import IngressMetrics, kv_bytes_per_token
from deployments.request_routing import RequestRouting, Route
from deployments.schemas import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    openapi_operation,
    parse,
)

app = FastAPI(title="Baton", description="OpenAI-compatible, PD-disaggregated LLM serving")


@app.exception_handler(APIError)
async def _api_error(_: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


@app.exception_handler(Exception)
async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    err = APIError(500, f"internal error: {type(exc).__name__}", "server_error")
    return JSONResponse(err.body(), status_code=500)


def _upstream_error(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return APIError(504, "request timed out", "timeout_error", code="timeout")
    return APIError(503, f"engine unavailable: {type(exc).__name__}", "server_error",
                    code="engine_unavailable", headers={"Retry-After": "1"})


@serve.deployment(name="ingress", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000)
@serve.ingress(app)
class Ingress:
    def __init__(self, cfg: dict, prefill, decode, indexer=None):
        from transformers import AutoTokenizer

        self.cfg = BatonConfig.model_validate(cfg)
        tracing.setup(self.cfg.tracing, "baton-ingress", REPO_ROOT)
        self.prefill, self.decode = prefill, decode
        self.indexer = indexer  # bound so Serve deploys it; the ingress only reads Redis
        self.metrics = IngressMetrics()
        self.gate = AsyncAdmission(Admission(self.cfg.admission,
                                             replicas=self.cfg.decode.replicas))
        self.kv_bytes_per_token = kv_bytes_per_token(self.cfg.model.resolved_path(), self.cfg.model.dtype)
        self.routing = RequestRouting(self.cfg, redis.asyncio.Redis.from_url(self.cfg.redis.url),
                                      self.metrics)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.cfg.model.resolved_path()))
        self.model = self.cfg.model.served_name

    # -- request preparation (no engine involved) --------------------------

    def _tenant(self, request: Request) -> str:
        keys = self.cfg.serve.api_keys
        if not keys:
            return DEFAULT_TENANT
        auth = request.headers.get("authorization", "")
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        if not token and self.cfg.serve.anonymous_tenant:
            return self.cfg.serve.anonymous_tenant
        if token not in keys:
            raise APIError(401, "Incorrect API key provided", code="invalid_api_key")
        return keys[token]

    def _prompt_ids(self, req: ChatCompletionRequest | CompletionRequest) -> list[int]:
        if isinstance(req, ChatCompletionRequest):
            messages = [{"role": m.role, "content": m.text()} for m in req.messages]
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return self.tokenizer.encode(text, add_special_tokens=False)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "batched prompts are not supported; send one prompt", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        vocab = len(self.tokenizer)
        if not prompt or any(t < 0 or t >= vocab for t in prompt):
            raise APIError(400, f"prompt token ids must be non-empty and in [0, {vocab})", param="prompt")
        return list(prompt)

    def _engine_request(self, req, request_id: str, tenant: str) -> EngineRequest:
        if req.model != self.model:
            raise APIError(404, f"The model '{req.model}' does not exist", param="model",
                           code="model_not_found")
        ids = self._prompt_ids(req)
        limit = self.cfg.model.max_model_len
        budget = req.token_budget()
        if len(ids) >= limit or (budget is not None and len(ids) + budget > limit):
            asked = len(ids) + (budget or 0)
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{asked} tokens ({len(ids)} in the prompt, {budget or 0} for the completion).",
                param="messages" if isinstance(req, ChatCompletionRequest) else "prompt",
                code="context_length_exceeded",
            )
        sampling = SamplingSpec(
            max_tokens=budget if budget is not None else limit - len(ids),
            temperature=req.temperature, top_p=req.top_p, seed=req.seed, stop=req.stop_list(),
            ignore_eos=req.ignore_eos,
        )
        return EngineRequest(request_id, ids, sampling, cache_salt=tenant)

    # -- the request path -----------------------------------------------------

    async def _route(self, ids: list[int], tenant: str, session: str | None) -> Route:
        if self.prefill is None:  # colocated: one pool, plain engines, Serve picks
            return Route(None, None, True, "colocated", 0)
        try:
            return await self.routing.route(ids, tenant, session)
        except redis.RedisError:
            # Routing state unavailable: serve anyway, Serve picks replicas.
            return Route(None, None, False, "fallback", 0)

    async def _run(self, request: Request, kind: str) -> JSONResponse | StreamingResponse:
        schema = ChatCompletionRequest if kind == "chat" else CompletionRequest
        req = parse(schema, await request.body())
        request_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        tenant = self._tenant(request)
        ereq = self._engine_request(req, request_id, tenant)
        session = request.headers.get(SESSION_HEADER)
        headers = {REQUEST_ID_HEADER: request_id}
        if session:
            headers[SESSION_HEADER] = session
        deadline = time.monotonic() + self.cfg.serve.request_timeout_s
        span = tracing.tracer().start_span("ingress")
        span.set_attribute("baton.request_id", request_id)
        span.set_attribute("baton.prompt_tokens", len(ereq.prompt_token_ids))
        out = render.Completion(kind, request_id, self.model, len(ereq.prompt_token_ids),
                                return_token_ids=req.return_token_ids)
        try:
            permit = await self._admit(request, tenant, span)
        except BaseException:
            span.end()
            raise
        try:
            route = await self._route(ereq.prompt_token_ids, tenant, session)
        except BaseException:
            self._release(permit, tenant)
            span.end()
            raise
        span.set_attribute("baton.route", route.reason)
        out.baton.route = route.reason
        out.baton.decode_only = route.decode_only
        out.baton.predicted_cached_tokens = route.predicted_cached_tokens
        self.routing.started(route)
        chunks = None
        try:
            chunks, first = await self._open(ereq, route, out, span, deadline)
            while not req.stream and first is not None:
                out.add(first)
                first = await self._next(chunks, deadline)
        except BaseException as exc:
            # Client gone, timeout or engine failure before the response
            # started: stop the engine work and answer (or re-raise) cleanly.
            if chunks is not None:
                chunks.cancel()
            self._release(permit, tenant)
            self._done(route, out, span)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise _upstream_error(exc) from None
        if not req.stream:
            self._release(permit, tenant)
            self._done(route, out, span)
            return JSONResponse(out.response(), headers=headers)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        # The engine is drained into a local queue and the permit released the
        # moment generation ends, however slowly the client reads the stream.
        queue: asyncio.Queue = asyncio.Queue()
        pump = asyncio.create_task(self._pump(first, chunks, deadline, queue, permit, tenant))
        body = self._stream(out, queue, pump, include_usage, route, span)
        return StreamingResponse(body, media_type="text/event-stream", headers=headers)

    async def _open(self, ereq: EngineRequest, route: Route, out: render.Completion, span,
                    deadline: float):
        """Starts the request and waits for its first chunk, retrying once.

        Nothing has reached the client yet, so a replica that dies (or an
        engine that fails) before the first token costs a retry, not an
        error: the second attempt lets Serve pick any live replica.
        """
        try:
            chunks = await self._start(ereq, route, out, span, deadline)
            return chunks, await self._next(chunks, deadline)
        except (APIError, asyncio.TimeoutError, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - replica or engine failure
            span.add_event("retry", {"error": type(exc).__name__})
            self.routing.prefill_done(route)
            self.routing.finished(route)
            out.baton.retried_after = type(exc).__name__
            retry = Route(None, None, route.decode_only, route.reason, route.predicted_cached_tokens)
            chunks = await self._start(ereq, retry, out, span, deadline)
            return chunks, await self._next(chunks, deadline)

    async def _start(self, ereq: EngineRequest, route: Route, out: render.Completion, span,
                     deadline: float):
        """Runs prefill (unless decode-only) and opens the decode stream."""
        with tracing.tracer().start_as_current_span("dispatch", context=tracing.context_of(span)):
            ereq.trace_context = tracing.inject()
            if not route.decode_only:
                try:
                    res = await asyncio.wait_for(
                        self.prefill.prefill.remote(replace(ereq, target_replica=route.prefill_replica)),
                        deadline - time.monotonic())
                finally:
                    self.routing.prefill_done(route)
                out.baton.prefill_cached_tokens = res.num_cached_tokens
                out.baton.prefill_replica = res.replica
            target = replace(ereq, target_replica=route.decode_replica)
            return self.decode.options(stream=True).generate.remote(target)

    def _done(self, route: Route, out: render.Completion, span) -> None:
        """Ends the request's accounting: in-flight counts, hit metrics, span."""
        self.routing.prefill_done(route)  # no-op unless prefill never returned
        self.routing.finished(route)
        bs, m = self.cfg.model.block_size, self.metrics
        m.record_hit(out.baton.cached_tokens() // bs, out.prompt_tokens // bs)
        if out.baton.prefill_cached_tokens is not None:  # decode loaded what prefill wrote
            m.kv_bytes.inc(out.baton.decode_cached_tokens * self.kv_bytes_per_token)
        now = time.monotonic()
        m.e2e.observe(now - out.started)
        if out.first_token_at is not None:
            m.ttft.observe(out.first_token_at - out.started)
            if out.completion_tokens > 1:
                m.tpot.observe((now - out.first_token_at) / (out.completion_tokens - 1))
        span.end()

    @staticmethod
    async def _next(chunks, deadline: float) -> EngineChunk | None:
        try:
            return await asyncio.wait_for(chunks.__anext__(), max(0.0, deadline - time.monotonic()))
        except StopAsyncIteration:
            return None

    async def _pump(self, first: EngineChunk | None, chunks, deadline: float,
                    queue: asyncio.Queue, permit, tenant: str) -> None:
        """Moves engine chunks into `queue`, then None (or the error); frees the permit."""
        try:
            chunk = first
            while chunk is not None:
                queue.put_nowait(chunk)
                chunk = await self._next(chunks, deadline)
            queue.put_nowait(None)
        except asyncio.CancelledError:
            chunks.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the stream as an error event
            queue.put_nowait(exc)
        finally:
            self._release(permit, tenant)

    async def _stream(self, out: render.Completion, queue: asyncio.Queue, pump: asyncio.Task,
                      include_usage: bool, route: Route, span) -> AsyncIterator[bytes]:
        try:
            if opening := out.first_event():
                yield opening
            while (item := await queue.get()) is not None:
                if isinstance(item, Exception):  # tokens already sent: end with an error event
                    err = _upstream_error(item)
                    yield render.error_event(err.message, err.type, err.code)
                    break
                out.add(item)
                yield out.delta_event(item)
            else:
                if include_usage:
                    yield out.usage_event()
        finally:
            pump.cancel()
            self._done(route, out, span)
        yield render.DONE

    # -- admission ----------------------------------------------------------------

    async def _admit(self, request: Request, tenant: str, span):
        """Waits for an engine permit in the tenant's fair queue; 429 when shed."""
        raw = request.headers.get(DEADLINE_HEADER)
        try:
            deadline_s = float(raw) if raw is not None else None
        except ValueError:
            raise APIError(400, f"{DEADLINE_HEADER} must be a number of seconds", param=DEADLINE_HEADER) from None
        if deadline_s is not None and not 0 < deadline_s <= 3600:
            raise APIError(400, f"{DEADLINE_HEADER} must be in (0, 3600]", param=DEADLINE_HEADER)
        replicas = self.routing.live_decode_replicas
        if replicas and replicas != self.gate.admission.replicas:
            self.gate.set_replicas(replicas)
        waited = time.monotonic()
        try:
            permit = await self.gate.acquire(tenant, None, deadline_s)
        except Shed as exc:
            self.metrics.shed.labels(tenant, exc.reason).inc()
            span.set_attribute("baton.shed", exc.reason)
            raise APIError(429, f"Baton is at capacity ({exc.reason}); retry after "
                                f"{exc.retry_after_s} s", "rate_limit_error", code=exc.reason,
                           headers=exc.headers) from None
        self.metrics.queue.observe(time.monotonic() - waited)
        self.metrics.permits.labels(tenant).inc()
        return permit

    def _release(self, permit, tenant: str) -> None:
        """Frees the engine permit (once) and wakes the next queued request."""
        if not permit.released:
            permit.release()
            self.metrics.permits.labels(tenant).dec()

    # -- routes -----------------------------------------------------------------

    @app.post("/v1/chat/completions", openapi_extra=openapi_operation(ChatCompletionRequest))
    async def chat_completions(self, request: Request):
        return await self._run(request, "chat")

    @app.post("/v1/completions", openapi_extra=openapi_operation(CompletionRequest))
    async def completions(self, request: Request):
        return await self._run(request, "text")

    @app.get("/v1/models")
    async def models(self):
        return {"object": "list", "data": [{
            "id": self.model, "object": "model", "created": 0, "owned_by": "baton",
            "max_model_len": self.cfg.model.max_model_len}]}

    @app.get("/health")
    async def health(self):
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics(self):
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")
