"""One completion request, top to bottom.

Chat completions, completions, Responses and Anthropic Messages (every route
that reaches an engine, deployments/api/apis.py) take this path; each stage is
a module of this package:

1. auth: the tenant (API key, batch line or forwarding site) and the body's
   declared size; another site may run it instead (sites.peers);
2. admit: an engine permit from the tenant's fair queue, or a 429;
3. parse: the body against the API's strict schema, the model, the session,
   a Responses chain;
4. model: the app of its model here (a catalogue: woken if cold, or a peer
   that has it resident);
5. route: this replica, a colocated peer when full, or the routing policy's
   decode and prefill replicas;
6. prefill: the prompt's KV computed into Mooncake (disaggregated only);
7. dispatch: the engine's answer, here or relayed from the chosen replica;
8. finish: the permit released, in-flight counts ended, latency recorded,
   once, as soon as the engine has answered (or a stage failed).
"""

from __future__ import annotations

from common import tracing
from deployments.api.response_store import ResponseCapture, input_items
from deployments.front import relay
from deployments.front.pipeline.admit import Admit
from deployments.front.pipeline.auth import Auth
from deployments.front.pipeline.dispatch import Dispatch
from deployments.front.pipeline.finish import Finish
from deployments.front.pipeline.parse import Parse
from deployments.front.pipeline.prefill import Prefill
from deployments.front.pipeline.request import Request


class Pipeline:
    """The stages of one front, each configured once (deployments/front/front.py builds them)."""

    def __init__(self, auth: Auth, admit: Admit, parse: Parse, models, placement, prefill: Prefill,
                 dispatch: Dispatch, finish: Finish, responses, local) -> None:
        self.auth, self.admit, self.parse, self.models, self.placement = auth, admit, parse, models, placement
        self.prefill, self.dispatch, self.finish = prefill, dispatch, finish
        self.responses, self.local = responses, local

    async def __call__(self, scope, receive, send, api) -> None:
        """Answers one completion request on `send`; APIError for a refusal before its answer began."""
        req = Request(scope, receive, send, api)
        await self.auth(req)
        if await self.auth.offloaded(req, lambda raw: self.parse.validated(api, raw)):
            return  # another site answered it
        if not api.generates:  # count_tokens: the template and tokenizer only, no engine step or permit
            self.parse.validated(api, raw := await self.auth.body(req))
            return await relay.run_local(self.local, scope, raw, receive, send, [], lambda _timing: None)
        await self.admit(req)
        try:
            await self.parse(req, await self.auth.body(req))
            if req.kind == "responses" and req.body.get("store") is not False:  # kept for previous_response_id
                return await self._kept(req)
            await self._answer(req)
        finally:
            self.finish(req)

    async def _kept(self, req: Request) -> None:
        """Answers a Responses request and stores what its client received, with its turn, before
        the answer's last message (ResponseCapture; its permit was released when the engine's
        answer ended: the relay runs finish then)."""
        turn = input_items(req.body["input"])
        req.send = capture = ResponseCapture(
            req.send, lambda response: self.responses.keep(req.tenant, response, turn, req.session),
            self.responses.hold_s)
        await self._answer(req)
        if capture.kept is not None:  # stored, or still waiting for Redis: up to its keep window
            await capture.kept

    async def _answer(self, req: Request) -> None:
        await self.models(req)
        req.identify()
        with tracing.tracer().start_as_current_span("ingress") as span:
            span.set_attribute("baton.request_id", req.request_id)
            req.stream = relay.EarlyStream(req.send, req.response_headers)
            if req.route is None:
                await self.placement(req)
            span.set_attribute("baton.route", req.info.route or "")
            await self.prefill(req)
            await self.dispatch(req, lambda timing: self.finish(req, timing))
