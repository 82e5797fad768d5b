"""Many simulated vLLM engines in one process, on one virtual clock (as Dynamo's mocker runs many).

Each `Engine` is vLLM's own `EngineCore`: its scheduler, KV cache manager
with prefix caching, eviction and preemption, and its KV-event stream, with
the forward pass on the timed executor (actors/sim/). Nothing sleeps: the
executor's clock is the fleet's virtual clock, so a step booked at time t
ends at t plus its profiled time, and 64 engines run on one core as fast as
their schedulers go. `Fleet.run` is a discrete-event loop: arrivals are
routed and added to an engine; an engine steps whenever it has work, its
outputs land at the step's end, and its KV events reach the caller then.

Times are exact in the profile's terms (not the machine's): what a routing
policy does to TTFT shows without the host's noise.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Callable

from actors.sim import EXECUTOR



@dataclass
class Outcome:
    """One request's life on the fleet, in virtual seconds."""

    engine: str
    arrival: float
    first_token: float | None = None
    finished: float | None = None
    cached_tokens: int | None = None
    prompt_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Capture:
    """Stands in for vLLM's KV-event publisher: keeps the batches the scheduler publishes."""

    def __init__(self):
        self.batches: list = []

    def publish(self, batch) -> None:
        self.batches.append(batch)

    def shutdown(self) -> None:
        pass


class Engine:
    """One vLLM EngineCore on the timed executor, driven by the fleet's clock."""

    def __init__(self, name: str, model: str, profile: str, clock: _Clock, max_model_len: int):
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.core import EngineCore
        from vllm.v1.executor.abstract import Executor

        from actors.sim.profile import GpuProfile

        bs = GpuProfile.load(profile).block_size
        args = EngineArgs(model=model, block_size=bs, max_model_len=max_model_len, enforce_eager=True,
                          enable_prefix_caching=True, distributed_executor_backend=EXECUTOR,
                          additional_config={"baton_sim": {"profile": profile}},
                          kv_events_config={"enable_kv_cache_events": True, "publisher": "null"})
        config = args.create_engine_config()
        self.name = name
        self.core = EngineCore(config, Executor.get_class(config), log_stats=True)
        ex = self.core.model_executor
        ex.clock, ex.sleep = clock, lambda s: None
        self.executor = ex
        self.events = _Capture()
        self.core.scheduler.kv_event_publisher = self.events
        self.busy_until: float | None = None  # a step is in flight until then

    def add(self, req_id: str, prompt: list[int], max_tokens: int, salt: str | None, now: float) -> None:
        from vllm import SamplingParams
        from vllm.v1.engine import EngineCoreRequest

        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0)
        req = EngineCoreRequest(request_id=req_id, prompt_token_ids=prompt, mm_features=None, sampling_params=sp,
                                pooling_params=None, arrival_time=now, lora_request=None, cache_salt=salt,
                                data_parallel_rank=None)
        request, wave = self.core.preprocess_add_request(req)
        self.core.add_request(request, wave)

    def step(self) -> tuple[float, list]:
        """Runs one scheduler step now; returns when it ends and its outputs."""
        now = self.executor.clock()
        outputs, ran = self.core.step()
        outs = [o for eco in outputs.values() for o in eco.outputs]
        # A step that scheduled nothing (every waiting request held back) tries again a millisecond on.
        return (self.executor._due if ran else now + 1e-3), outs

    def take_events(self) -> list:
        batches, self.events.batches = self.events.batches, []
        return [ev for b in batches for ev in b.events]

    def load(self) -> dict:
        """The scheduler's load as the replica's heartbeat reports it (actors/vllm_plugin.baton_load), and
        the prompt tokens still to compute: what a front's count of queued work stands for (its oldest_wait_s
        is in wall time against virtual arrivals: the fleet's callers do not read it)."""
        from actors.vllm_plugin import baton_load

        sched = self.core.scheduler
        queued = sum(r.num_prompt_tokens - r.num_computed_tokens for r in (*sched.waiting, *sched.running)
                     if r.num_computed_tokens < r.num_prompt_tokens)
        return {**baton_load(self.core), "queued_prefill_tokens": queued}

    def has_work(self) -> bool:
        return self.core.scheduler.has_requests()


class Fleet:
    """`n` engines named e0..e{n-1} and the virtual-time loop that drives them."""

    def __init__(self, n: int, model: str, profile: str, max_model_len: int = 2048, progress: Callable | None = None):
        self.clock = _Clock()
        self.engines: dict[str, Engine] = {}
        for i in range(n):
            self.engines[f"e{i}"] = Engine(f"e{i}", model, profile, self.clock, max_model_len)
            if progress:
                progress(i + 1, n)

    def run(self, arrivals: list[tuple[float, object]], on_arrival: Callable, on_output: Callable,
            on_events: Callable, until: float = float("inf"), progress: Callable | None = None) -> None:
        """Plays `arrivals` ((time, payload), sorted) and whatever the callbacks add:
        `on_arrival(payload, now)` returns (engine, req_id, prompt, max_tokens, salt) or None;
        `on_output(engine, output, now)` returns more arrivals (a session's next turn) or [];
        `on_events(engine, events, now)` gets each step's KV events when the step ends;
        `progress(now)` is called every 10 s of wall time."""
        import time

        seq, shown = itertools.count(), time.monotonic()
        heap = [(t, next(seq), "arrive", p) for t, p in arrivals]
        heapq.heapify(heap)
        while heap:
            t, _, kind, payload = heapq.heappop(heap)
            if t > until:
                break
            self.clock.now = t
            if progress and time.monotonic() - shown > 10:
                progress(t)
                shown = time.monotonic()
            if kind == "arrive":
                placed = on_arrival(payload, t)
                if placed is None:
                    continue
                eng = self.engines[placed[0]]
                eng.add(*placed[1:], now=t)
            else:
                eng, outs = payload
                eng.busy_until = None
                on_events(eng.name, eng.take_events(), t)
                for o in outs:
                    for at, p in on_output(eng.name, o, t):
                        heapq.heappush(heap, (at, next(seq), "arrive", p))
            if eng.busy_until is None and eng.has_work():
                end, outs = eng.step()
                eng.busy_until = end
                heapq.heappush(heap, (end, next(seq), "done", (eng, outs)))

    def shutdown(self) -> None:
        """Shuts every engine core down, tearing the process's shared state down once: each core's
        own teardown collects the whole heap (64 full collections of ~5 GB took minutes)."""
        from vllm.v1.engine import core as core_module

        cleanup = core_module.cleanup_dist_env_and_memory
        core_module.cleanup_dist_env_and_memory = lambda *a, **kw: None
        try:
            for e in self.engines.values():
                e.core.shutdown()
        finally:
            core_module.cleanup_dist_env_and_memory = cleanup
        cleanup()
