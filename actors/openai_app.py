"""vLLM's own OpenAI server, in-process, around one engine replica's AsyncLLM.

The engine replica serves requests with vLLM's OpenAI layer: the same chat
template, tool-call parser, structured output, logprobs, `n`, penalties and
SSE rendering as `vllm serve`, built by vLLM's `build_app` and
`init_app_state` on top of the replica's AsyncLLM. Baton adds the calls it
needs around that app:

- `prompt_ids` renders a request the way the app will (chat template,
  tools), so the router can hash its blocks; the ids then travel with the
  request in `kv_transfer_params.prompt_token_ids`, which vLLM's renderer
  takes instead of templating and tokenising again.
- `prefill` runs a request's prompt with max_tokens=1 so its KV lands in
  Mooncake, and returns once the connector has saved it.

Everything here runs on the event loop that built the engine; AsyncLLM is
bound to it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import time
import uuid
from dataclasses import dataclass

from actors import engine_args
from actors.direct_routes import DirectRoutes
from actors.finisher import FINISHED_PATHS
from actors.save_watch import DrainBudget, SaveWatch
from common.config import BatonConfig
from common.constants import ENGINE_DEAD_RETRY_S, ENGINE_GONE, NO_LOOKUP
from common.processes import free_ports

SAVE_DRAIN_TIMEOUT_S = 10.0
SAVE_DRAIN_FLOOR_S = 1.0  # the least a drain may wait, and all after one ran out (save_watch.py DrainBudget)
SAVE_RECHECK_S = 0.5
# vLLM's chat server's last resort for unset sampling fields (ChatCompletionRequest's
# _DEFAULT_SAMPLING_PARAMS, less the penalties a first-token request leaves at 0).
OPENAI_SAMPLING_DEFAULTS = {"repetition_penalty": 1.0, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}


@dataclass
class PrefillResult:
    """What a prefill did: prompt length, the tokens it found cached, and how
    long computing the prompt and draining its KV saves took."""

    prompt_tokens: int
    cached_tokens: int
    compute_s: float
    drain_s: float
    drain_end: str = ""  # what ended the wait: none_left, push, recheck, poll or timeout


class _NoServer:
    """What vLLM's engine-error handler finds as `app.state.server`: it asks `vllm serve`'s uvicorn
    server to exit once the engine died (`should_exit`); a replica's app has no server of its own."""

    should_exit = False


def _engine_errors(app) -> None:
    """Answers an engine's failure as the replica's own: vLLM's handler for it stops the uvicorn
    server of `vllm serve` (`app.state.server`), which this in-process app does not have; it raised
    AttributeError there, and the client got a 500 naming it. A dead engine is a 503 with
    Retry-After, in OpenAI's shape (the catalogue wakes the model again; Serve replaces a replica
    whose engine died, its health check failing); a failed generation is the error vLLM would
    answer. vLLM's `build_app` has built the app's middleware already, so the handlers go to its
    ExceptionMiddleware too. Changes `app`: its handlers for these two errors and `state.server`."""
    from starlette.middleware.exceptions import ExceptionMiddleware
    from starlette.responses import JSONResponse
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
    from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

    async def dead(_request, _exc):
        return JSONResponse(ENGINE_GONE, status_code=503, headers={"retry-after": str(ENGINE_DEAD_RETRY_S)})

    async def failed(_request, exc):
        err = create_error_response(exc)
        return JSONResponse(err.model_dump(), status_code=err.error.code)

    app.state.server = _NoServer()
    layer = app.middleware_stack
    while layer is not None and not isinstance(layer, ExceptionMiddleware):
        layer = getattr(layer, "app", None)
    for target in (app, layer):
        if target is not None:
            target.add_exception_handler(EngineDeadError, dead)
            target.add_exception_handler(EngineGenerateError, failed)


def frontend_args(cfg: BatonConfig):
    """vLLM's FrontendArgs for the in-process server (no vLLM CLI parsing)."""
    from vllm.entrypoints.launchers.cli_args import FrontendArgs

    parser = cfg.model.tool_call_parser
    return FrontendArgs(
        enable_auto_tool_choice=parser is not None,
        tool_call_parser=parser,
        enable_prompt_tokens_details=True,  # cached_tokens is always reported
        disable_uvicorn_access_log=True,
        disable_fastapi_docs=False,
        enable_per_request_metrics=cfg.serve.request_metrics,
    )


def request_model(kind: str):
    """vLLM's pydantic model of a `responses`, `messages` or `count_tokens` request body."""
    if kind == "responses":
        from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

        return ResponsesRequest
    from vllm.entrypoints.anthropic.protocol import AnthropicCountTokensRequest, AnthropicMessagesRequest

    return AnthropicMessagesRequest if kind == "messages" else AnthropicCountTokensRequest


class EngineApp:
    """One AsyncLLM and vLLM's OpenAI app over it; built by `start`."""

    def __init__(self, cfg: BatonConfig, role: engine_args.Role, replica: str, events_host: str = "127.0.0.1"):
        self.cfg, self.role, self.replica = cfg, role, replica
        self.events_host = events_host
        self.events_replay: str | None = None  # set by `start` where the engine publishes KV events
        self.engine = None
        self.app = None
        self.direct = None  # `app` with its generation routes called directly (actors/direct_routes.py)
        self.state = None
        self.saves = None  # a SaveWatch on prefill replicas
        self.drain = DrainBudget(SAVE_DRAIN_TIMEOUT_S, SAVE_DRAIN_FLOOR_S)  # how long a prefill waits for its saves
        self.spec = None  # a SpecCounts where the pool speculates

    async def start(self) -> None:
        """Starts the engine (a minute on CPU) and builds the app's state."""
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.app import build_app
        from vllm.v1.engine.async_llm import AsyncLLM

        # KV events feed the router's index; an unrouted colocated engine has no reader.
        topic = self.replica if self.cfg.routes() else None
        if topic:
            host = f"[{self.events_host}]" if ":" in self.events_host else self.events_host
            self.events_replay = f"tcp://{host}:{free_ports(1)[0]}"
        eargs = engine_args.build(self.cfg, self.role, topic=topic, replay_endpoint=self.events_replay)
        if eargs.kv_transfer_config is not None:
            eargs.worker_extension_cls = "actors.kv_probe.KVProbeExtension"
        loggers = None
        # The engine's stats feed vLLM's Prometheus series (deployments/front/metrics_scrape.py EngineSeries),
        # without vLLM's log line every 10 s.
        logging.getLogger("vllm.v1.metrics.loggers").setLevel(logging.WARNING)
        if eargs.speculative_config is not None:  # count acceptance from the engine's stats (actors/spec_stats.py)
            from actors.spec_stats import SpecCounts, stat_logger

            self.spec = SpecCounts()
            loggers = [stat_logger(self.spec)]
        # The constructor waits for the engine core's handshake (seconds): off the loop, so a replica
        # that wakes one model of a catalogue keeps serving the others meanwhile.
        self.engine = await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(AsyncLLM.from_engine_args, eargs, stat_loggers=loggers))
        self.engine._run_output_handler()  # as vLLM's constructor does when built on the loop
        if self.role == "prefill":
            await self._watch_saves()
        args = argparse.Namespace(**(vars(frontend_args(self.cfg)) | vars(eargs)))
        args.served_model_name = [self.cfg.model.served_name]  # the CLI's list form
        tasks = await self.engine.get_supported_tasks()
        self.app = build_app(args, tasks, self.engine.model_config)
        await init_app_state(self.engine, self.app.state, args, tasks)
        _engine_errors(self.app)
        self.direct = DirectRoutes(self.app, FINISHED_PATHS)
        self.state = self.app.state

    async def _watch_saves(self) -> None:
        """Has the workers push save completions to a SaveWatch; without one, prefill polls."""
        watch = SaveWatch()
        watch.start()
        if all(await self.engine.collective_rpc("watch_kv_saves", args=(watch.address,))):
            self.saves = watch
        else:
            watch.close()

    @property
    def capacity_blocks(self) -> int:
        return self.engine.vllm_config.cache_config.num_gpu_blocks or 0

    @property
    def seqs_limit(self) -> int | None:
        """What admission may follow of this engine's max_num_seqs (engine_args.seqs_limit)."""
        return engine_args.seqs_limit(self.engine.vllm_config)

    async def _engine_input(self, kind: str, body: dict):
        """The engine input vLLM's serving layer would build for `body`.

        Raises ValueError with vLLM's message when the request is invalid.
        """
        from pydantic import ValidationError
        from vllm.exceptions import VLLMClientError

        try:
            return await self._render(kind, body)
        except (VLLMClientError, ValidationError, TypeError, KeyError) as exc:  # what the body's content caused
            raise ValueError(str(exc)) from None

    async def _render(self, kind: str, body: dict):
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse

        if kind in ("chat", "text"):
            # vLLM's render_chat_request / render_completion_request less their engine preflight: the
            # prompt is rendered to route it, and the engine that runs it checks its own health and
            # admission then (a dead engine here must not keep the front from routing elsewhere).
            chat = kind == "chat"
            serving = self.state.openai_serving_chat if chat else self.state.openai_serving_completion
            request = (ChatCompletionRequest if chat else CompletionRequest).model_validate(body)
            inputs = await serving._check_model(request)
            if inputs is None:
                renderer = serving.online_renderer
                result = await (renderer.render_chat(request) if chat else renderer.render_completion(request))
                inputs = result[1] if chat and not isinstance(result, ErrorResponse) else result
        else:  # vLLM's own conversion of a Responses or Messages request (deployments/api/apis.py)
            # On a copy: vLLM's validators put their own objects into the dict they check.
            request = request_model(kind).model_validate(json.loads(json.dumps(body)))
            render = self.state.serving_render
            inputs = await (render.render_responses_request(request) if kind == "responses"
                            else render.render_messages_request(request))
        if isinstance(inputs, ErrorResponse):
            raise ValueError(inputs.error.message)
        if not isinstance(inputs, list):  # a Responses or Messages request: vLLM's render layer's ids
            return {"prompt_token_ids": inputs.token_ids}
        if len(inputs) != 1:
            raise ValueError("batched prompts are not supported; send one prompt")
        return inputs[0]

    async def prompt_ids(self, kind: str, body: dict) -> list[int]:
        """The prompt's token ids, rendered exactly as the app renders `body`."""
        return list((await self._engine_input(kind, body))["prompt_token_ids"])

    async def prefill(self, prompt_ids: list[int], cache_salt: str | None, sampling: dict | None = None,
                      on_token=None, lookup: bool = True) -> PrefillResult:
        """Computes the prompt's KV, waits until it is saved to Mooncake.

        Adds the prompt's full blocks to this engine's prefix cache and to the
        store. With `sampling` (the request's fields of deployments/front/first_token.py
        SAMPLING), the one token is sampled as the request's first and awaited
        `on_token({"token_id", "text", "finish_reason"})` gets it before the
        saves drain; without, it is greedy and discarded. `lookup=False` skips
        the connector's store lookup (kvstore/connector.py).
        """
        started = time.monotonic()
        prompt: dict = {"prompt_token_ids": prompt_ids}
        if cache_salt:
            prompt["cache_salt"] = cache_salt
        request_id = f"prefill-{uuid.uuid4().hex}"
        cached, last = 0, None
        params = self._one_token(sampling)
        if not lookup:
            params.extra_args = {**(params.extra_args or {}), "kv_transfer_params": {NO_LOOKUP: True}}
        async for out in self.engine.generate(prompt, params, request_id):
            cached, last = out.num_cached_tokens or cached, out
        computed = time.monotonic()
        if on_token is not None and last is not None and last.outputs and last.outputs[0].token_ids:
            first = last.outputs[0]
            await on_token({"token_id": int(first.token_ids[0]), "text": first.text,
                            "finish_reason": first.finish_reason})
        end = await self._drain_saves(request_id, computed, self.drain.seconds())
        drained = time.monotonic() - computed
        self.drain.ended(end, drained)
        return PrefillResult(len(prompt_ids), cached, computed - started, drained, end)

    def _one_token(self, sampling: dict | None):
        """SamplingParams for the prefill's one token: the request's fields over the
        model's generation defaults over OpenAI's, as vLLM's chat server builds them."""
        from vllm import SamplingParams

        if sampling is None:
            return SamplingParams(max_tokens=1, temperature=0.0)
        defaults = self.engine.model_config.get_diff_sampling_param()
        fields = {k: sampling.get(k, defaults.get(k, d)) for k, d in OPENAI_SAMPLING_DEFAULTS.items()}
        return SamplingParams.from_optional(max_tokens=1, ignore_eos=bool(sampling.get("ignore_eos", False)),
                                            stop_token_ids=defaults.get("stop_token_ids"), **fields)

    async def _drain_saves(self, request_id: str, finished: float, timeout_s: float) -> str:
        """Waits until the connector has no queued store job of `request_id`,
        which finished generating at `finished`.

        MooncakeStoreConnector saves on a background thread after the request
        finished. One question to the workers tells whether anything is left;
        then the workers' push (SaveWatch) ends the wait, with a question
        every SAVE_RECHECK_S in case a push is lost, or, without a watch, at
        backing-off intervals. Gives up after `timeout_s` (`timeout`: the front
        then has decode recompute the prompt without asking the store). Returns
        what ended the wait.
        """
        deadline = time.monotonic() + timeout_s
        delay, end = 0.001, "none_left"
        while time.monotonic() < deadline:
            if self.saves is not None and self.saves.saved_since(request_id, finished):
                return "push"
            pending = await self.engine.collective_rpc("pending_kv_saves", args=(request_id,))
            if not any(pending):
                return end
            if self.saves is not None:
                if await self.saves.wait(request_id, finished, min(SAVE_RECHECK_S, deadline - time.monotonic())):
                    return "push"
                end = "recheck"
            else:
                await asyncio.sleep(delay)
                delay, end = min(delay * 2, 0.02), "poll"
        return "timeout"

    def running(self) -> int:
        """Requests in this engine now (waiting or running), whoever sent them."""
        return 0 if self.engine is None else self.engine.get_num_unfinished_requests()

    async def engine_load(self) -> dict:
        """The scheduler's own figures (running, waiting, free and total KV blocks, the
        oldest wait; actors/vllm_plugin.py `baton_load`); {} if the engine cannot say."""
        try:
            return await self.engine.engine_core.call_utility_async("baton_load")
        except Exception:  # noqa: BLE001 - a load report is optional; routing falls back to counts
            return {}

    def errored(self) -> bool:
        return self.engine is None or bool(self.engine.errored)

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
        if self.saves is not None:
            self.saves.close()
