"""An engine replica: one vLLM AsyncLLM inside a Ray Serve replica actor.

The same class serves both pools; its role decides the KV connector side.
- `prefill` runs the prompt with max_tokens=1 so the KV lands in Mooncake,
  and returns once the connector's background saves of that request drained.
- `decode` (and `colocated`) streams generated tokens; a decode engine loads
  the prompt's full blocks from Mooncake before computing the remainder.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import AsyncIterator

from actors import engine_args
from actors.coalesce import coalesce
from actors.protocol import EngineChunk, EngineRequest, PrefillResult, SamplingSpec
from common import tracing
from actors.heartbeat import Heartbeat
from common.config import BatonConfig
from common.constants import REPO_ROOT

SAVE_DRAIN_TIMEOUT_S = 10.0
SAVE_POLL_S = 0.005


def _sampling_params(spec: SamplingSpec, max_tokens: int | None = None):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=spec.max_tokens if max_tokens is None else max_tokens,
        temperature=spec.temperature,
        top_p=spec.top_p,
        seed=spec.seed,
        stop=spec.stop or None,
        ignore_eos=spec.ignore_eos,
        output_kind=RequestOutputKind.DELTA,
    )


class EngineServer:
    """Hosts one AsyncLLM; each call below runs one request through it."""

    def __init__(self, cfg: dict, role: engine_args.Role):
        from vllm.v1.engine.async_llm import AsyncLLM

        self.cfg = BatonConfig.model_validate(cfg)
        self.role = role
        self.pool = "prefill" if role == "prefill" else "decode"
        tracing.setup(self.cfg.tracing, f"baton-{role}", REPO_ROOT)
        self.replica = self._replica_id()
        args = engine_args.build(self.cfg, role, topic=self.replica)
        if role != "colocated":
            args.worker_extension_cls = "actors.kv_probe.KVProbeExtension"
        self.engine = AsyncLLM.from_engine_args(args)
        self.heartbeat = Heartbeat(self.cfg, self.pool, self.replica, {
            "capacity_blocks": self.engine.vllm_config.cache_config.num_gpu_blocks or 0,
        })

    @staticmethod
    def _replica_id() -> str:
        try:
            from ray import serve

            return serve.get_replica_context().replica_id.unique_id
        except Exception:  # noqa: BLE001 - outside Serve (tests, scripts)
            return f"pid-{os.getpid()}"

    def _prompt(self, req: EngineRequest) -> dict:
        prompt: dict = {"prompt_token_ids": req.prompt_token_ids}
        if req.cache_salt:
            prompt["cache_salt"] = req.cache_salt
        return prompt

    async def prefill(self, req: EngineRequest) -> PrefillResult:
        """Computes the prompt's KV and waits until it is saved to Mooncake.

        Adds the request's full blocks to this engine's prefix cache and to
        the store; the one sampled token is discarded.
        """
        ctx = tracing.extract(req.trace_context)
        with tracing.tracer().start_as_current_span("prefill", context=ctx) as span:
            span.set_attribute("baton.request_id", req.request_id)
            span.set_attribute("baton.replica", self.replica)
            cached = 0
            async for out in self.engine.generate(
                self._prompt(req), _sampling_params(req.sampling, max_tokens=1), req.request_id
            ):
                cached = out.num_cached_tokens or cached
            with tracing.tracer().start_as_current_span("kv_save_drain"):
                await self._drain_saves(req.request_id)
            span.set_attribute("baton.prompt_tokens", len(req.prompt_token_ids))
            span.set_attribute("baton.cached_tokens", cached)
        return PrefillResult(req.request_id, len(req.prompt_token_ids), cached, self.replica)

    async def _drain_saves(self, request_id: str) -> None:
        deadline = time.monotonic() + SAVE_DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            pending = await self.engine.collective_rpc("pending_kv_saves", args=(request_id,))
            if not any(pending):
                return
            await asyncio.sleep(SAVE_POLL_S)

    async def generate(self, req: EngineRequest) -> AsyncIterator[EngineChunk]:
        """Streams the completion of `req` as deltas.

        The first chunk carries the prompt's cached-token count, which on a
        decode replica covers the blocks loaded from Mooncake.
        """
        ctx = tracing.extract(req.trace_context)
        tracer = tracing.tracer()
        with tracer.start_as_current_span("decode", context=ctx) as span:
            span.set_attribute("baton.request_id", req.request_id)
            span.set_attribute("baton.replica", self.replica)
            # Until the first output, the engine is loading KV and computing
            # the uncached tail of the prompt: that interval is the KV load.
            kv_span = tracer.start_span("kv_load")
            kv_span.set_attribute("baton.request_id", req.request_id)
            first = True
            stream = self.engine.generate(self._prompt(req), _sampling_params(req.sampling), req.request_id)
            async for outs in coalesce(stream):
                chunk = self._chunk(req, outs)
                if first:
                    kv_span.set_attribute("baton.cached_tokens", chunk.num_cached_tokens)
                    kv_span.end()
                    span.set_attribute("baton.cached_tokens", chunk.num_cached_tokens)
                    first = False
                yield chunk
            if first:
                kv_span.end()

    def _chunk(self, req: EngineRequest, outs: list) -> EngineChunk:
        """One EngineChunk from consecutive DELTA outputs of one request."""
        comps = [o.outputs[0] for o in outs]
        last = outs[-1]
        return EngineChunk(
            text="".join(c.text for c in comps),
            token_ids=[t for c in comps for t in c.token_ids],
            finish_reason=comps[-1].finish_reason if last.finished else None,
            prompt_tokens=len(req.prompt_token_ids),
            num_cached_tokens=outs[0].num_cached_tokens or last.num_cached_tokens or 0,
            replica=self.replica,
        )

    async def check_health(self) -> None:
        """Serve's health probe: raises if the engine core died."""
        if self.engine.errored:
            raise RuntimeError(f"engine of {self.role} replica {self.replica} is dead")

    def __del__(self):
        heartbeat = getattr(self, "heartbeat", None)
        if heartbeat is not None:
            heartbeat.stop()
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
