"""A vLLM executor that models the GPU: every step sleeps the profiled time.

Chosen with `distributed_executor_backend="actors.sim.timed_executor.TimedExecutor"`
(vLLM resolves the qualified name: v1/executor/abstract.py `get_class`), so
`vllm serve`, Ray Serve LLM and Baton all run it unchanged. Everything of
vLLM above the model stays real: the scheduler and continuous batching, the
KV cache manager with prefix caching, eviction and preemption, the KV-event
publisher, the OpenAI layer and the detokeniser. Only the forward pass is
replaced: `execute_model` prices the step from the profile
(actors/sim/profile.py) and `sample_tokens` waits until that time has passed,
then returns one token per sequence whose computation reached its end.

Settings travel in vLLM's `additional_config` under `baton_sim` (so they
reach the engine core of every peer the same way):

- `profile`: a profile name in actors/sim/profiles/ or a path (default
  h100_llama31_8b);
- `speedup`: divides every time, to fit many engines on few cores;
- `tokens`: `random` (seeded by the prompt, or by the request's `seed`) or
  `echo` (the prompt, copied cyclically); stop tokens are never drawn, so a
  request runs to `max_tokens` unless a grammar ends it;
- `apply_limits` (default true): the profiled GPU's KV block count,
  `max_num_seqs` and `max_num_batched_tokens` replace the engine's own.

The profiled block size must equal the engine's (ValueError otherwise). The
one KV connector it takes is its own (actors/sim/timed_store.py: the store's
part of a disaggregated hop, the transfer priced by the profile); it refuses
any other, and speculative decoding, at start.
It is a benchmark instrument; the serving path's tests keep real engines.
"""

from __future__ import annotations

import time
from concurrent.futures import Future

from vllm.logger import init_logger
from vllm.v1.executor.abstract import Executor
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, KVConnectorOutput, ModelRunnerOutput
from vllm.v1.worker.worker_base import CompilationTimes

from actors.sim import CONNECTOR, CONNECTOR_MODULE, EXECUTOR, timed_store
from actors.sim.profile import DEFAULT, GpuProfile, StepShape
from actors.sim.sequences import NewSeq, Sequences

logger = init_logger(__name__)

CONFIG_KEY = "baton_sim"
LOAD_POLL_S = 0.001  # an idle step's wait for a KV load in flight: new requests still arrive meanwhile


def profiled_seqs(vllm_config) -> int | None:
    """The profiled GPU's max_num_seqs where `vllm_config` runs the timed executor (the engine's own
    where `apply_limits` is off); None otherwise. For the front's process: the executor sets the
    limits in the engine core's, which the front's copy of the config never sees."""
    backend = vllm_config.parallel_config.distributed_executor_backend
    if backend is not TimedExecutor and backend != EXECUTOR:
        return None
    opts = (vllm_config.additional_config or {}).get(CONFIG_KEY, {})
    if not opts.get("apply_limits", True):
        return vllm_config.scheduler_config.max_num_seqs
    return GpuProfile.load(opts.get("profile", DEFAULT)).max_num_seqs


class TimedExecutor(Executor):
    """vLLM's executor interface with the model replaced by a profiled sleep (module docstring)."""

    def _init_executor(self) -> None:
        opts = dict((self.vllm_config.additional_config or {}).get(CONFIG_KEY, {}))
        self.profile = GpuProfile.load(opts.get("profile", DEFAULT))
        self.speedup = float(opts.get("speedup", 1.0))
        if self.speedup <= 0:
            raise ValueError(f"additional_config.{CONFIG_KEY}.speedup must be > 0, got {self.speedup}")
        ktc = self.vllm_config.kv_transfer_config
        if ktc is not None and ktc.kv_connector != CONNECTOR:
            raise ValueError(f"the timed executor models only its own KV connector ({CONNECTOR}, "
                             f"module {CONNECTOR_MODULE}), not {ktc.kv_connector}")
        if self.vllm_config.speculative_config is not None:
            raise ValueError("the timed executor models no speculative decoding: remove speculative_config")
        if self.cache_config.block_size != self.profile.block_size:
            raise ValueError(f"block size {self.cache_config.block_size} differs from GPU profile "
                             f"{self.profile.name}'s {self.profile.block_size}: set the engine's block size to it")
        if opts.get("apply_limits", True):
            self.scheduler_config.max_num_seqs = self.profile.max_num_seqs
            self.scheduler_config.max_num_batched_tokens = self.profile.max_num_batched_tokens
            self.cache_config.num_gpu_blocks_override = self.profile.num_gpu_blocks
        self.seqs = Sequences(self.model_config.get_vocab_size(), echo=opts.get("tokens", "random") == "echo")
        self.clock, self.sleep = time.monotonic, time.sleep  # replaceable in tests
        self._due = 0.0
        self._loads: dict[str, float] = {}  # request id -> when its KV load ends (timed connector)
        self._link_free = 0.0
        self._pending: set[str] = set()
        self.order: list[str] = []
        self.busy_s = 0.0  # modelled GPU seconds so far (after speedup)
        self.steps = 0
        logger.info("timed executor: profile %s (%s), speedup %.1f, %d KV blocks", self.profile.name,
                    self.profile.kind, self.speedup, self.profile.num_gpu_blocks)

    # --- the engine core's set-up calls ---------------------------------------------------------

    def get_kv_cache_specs(self) -> list[dict]:
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        m, p = self.model_config, self.parallel_config
        spec = FullAttentionSpec(block_size=self.cache_config.block_size, num_kv_heads=m.get_num_kv_heads(p),
                                 head_size=m.get_head_size(), dtype=m.dtype)
        return [{f"model.layers.{i}.self_attn.attn": spec for i in range(m.get_num_layers(p))}]

    def determine_available_memory(self) -> list[int]:
        """Exactly the profiled block count's bytes (the engine then finds num_gpu_blocks of them)."""
        (specs,) = self.get_kv_cache_specs()
        return [self.profile.num_gpu_blocks * sum(s.page_size_bytes for s in specs.values())]

    def get_supported_kv_cache_layouts(self) -> list[list[str]]:
        return [["NHD"]]

    def set_kv_cache_layout(self, layout_name: str) -> None:
        pass

    def initialize_from_config(self, kv_cache_configs) -> None:
        pass

    def compile_or_warm_up_model(self) -> None:
        pass

    def check_health(self) -> None:
        pass

    def shutdown(self) -> None:
        self.seqs.clear()

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False):
        """Worker calls by name: what the modelled GPU has an answer for; anything else is refused."""
        answers = {"get_supported_tasks": ("generate",), "check_health": None, "shutdown": None,
                   "update_max_model_len": None, "synchronize_device": None, "reset_mm_cache": None,
                   "reset_encoder_cache": None, "compile_or_warm_up_model": CompilationTimes(0.0, 0.0),
                   "supports_draft_weight_updates": False, "list_loras": set(),
                   # actors/kv_probe.py's questions, answered by the timed connector (timed_store.py)
                   "spill_stats": {}, "spill_refresh": -1,
                   "get_kv_connector_handshake_metadata": None}
        name = method if isinstance(method, str) else getattr(method, "__name__", repr(method))
        if name == "pending_kv_saves":
            out = [sum(c.pending(*args) for c in timed_store.ACTIVE)]
        elif name == "watch_kv_saves":
            out = [bool(timed_store.ACTIVE) and all([c.watch(*args) for c in timed_store.ACTIVE])]
        elif name in answers:
            out = [answers[name]]
        else:
            raise NotImplementedError(f"the timed executor has no worker to run {name!r} on")
        return _done(out) if non_block else out

    # --- one step ---------------------------------------------------------------------------

    def execute_model(self, scheduler_output, non_block: bool = False):
        """Books the step's modelled time and which requests sample a token; the wait is in sample_tokens,
        so the scheduler's grammar work overlaps the modelled GPU as it overlaps a real one. Starts the
        step's KV loads (timed connector) on the link's clock."""
        self._start_loads(getattr(scheduler_output, "kv_connector_metadata", None))
        if not scheduler_output.total_num_scheduled_tokens:
            for req_id in scheduler_output.finished_req_ids:
                self.seqs.seqs.pop(req_id, None)
            if self._loads:  # only loads in flight: wait a little for them rather than spin
                self.sleep(max(0.0, min(LOAD_POLL_S, min(self._loads.values()) - self.clock())))
            received = self._received()
            out = EMPTY_MODEL_RUNNER_OUTPUT if received is None else ModelRunnerOutput(
                req_ids=[], req_id_to_index={}, kv_connector_output=received)
            return _done(out) if non_block else out
        shape, self._pending = self._plan(scheduler_output)
        step = self.profile.step_s(shape) / self.speedup
        self._due = max(self.clock(), self._due) + step
        self.busy_s += step
        self.steps += 1
        return _done(None) if non_block else None

    def sample_tokens(self, grammar_output, non_block: bool = False):
        """Waits out the booked step, then gives each finishing sequence its next token."""
        wait = self._due - self.clock()
        if wait > 0:
            self.sleep(wait)
        masks = {}
        if grammar_output is not None:
            masks = dict(zip(grammar_output.structured_output_request_ids, grammar_output.grammar_bitmask))
        ids = self.order
        sampled = [[self.seqs.draw(r, None if r not in masks else _allowed(masks[r]))] if r in self._pending
                   else [] for r in ids]
        out = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled, kv_connector_output=self._received())
        return _done(out) if non_block else out

    def _start_loads(self, meta) -> None:
        """Queues each load `meta` starts on the engine's one link: it ends the profile's transfer
        time (sped up) after the link is free."""
        for req_id, tokens in (getattr(meta, "loads", None) or {}).items():
            self._link_free = max(self.clock(), self._link_free) + self.profile.kv_transfer_s(tokens) / self.speedup
            self._loads[req_id] = self._link_free

    def _received(self) -> KVConnectorOutput | None:
        """The loads whose time has passed, as the worker reports them (`finished_recving`); even a
        finished request's: vLLM holds its blocks until its load is reported."""
        now = self.clock()
        done = {r for r, due in self._loads.items() if due <= now}
        for r in done:
            del self._loads[r]
        return KVConnectorOutput(finished_recving=done) if done else None

    def _plan(self, so) -> tuple[StepShape, set[str]]:
        """vLLM's SchedulerOutput in the plain terms of `Sequences.plan`."""
        new = []
        for r in so.scheduled_new_reqs:
            sp = r.sampling_params
            new.append(NewSeq(r.req_id, list(r.prompt_token_ids or ()), r.num_computed_tokens,
                              sp.seed if sp is not None else None, set(sp.all_stop_token_ids) if sp else set()))
        c = so.scheduled_cached_reqs
        self.order = list(so.num_scheduled_tokens)
        return self.seqs.plan(new, dict(zip(c.req_ids, c.num_computed_tokens)), so.num_scheduled_tokens,
                              so.finished_req_ids)


def _allowed(mask) -> list[int]:
    """The token ids one row of vLLM's grammar bitmask (int32 words, bit i of word w = token 32w+i) allows."""
    import numpy as np

    bits = np.unpackbits(np.ascontiguousarray(mask).view(np.uint8), bitorder="little")
    return np.flatnonzero(bits)[:4096].tolist()


def _done(value) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut
