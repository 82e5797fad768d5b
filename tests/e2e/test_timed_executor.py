"""The timed executor under vLLM's real engine: the profile's limits applied, the modelled time exact,
prefix caching and answers as vLLM gives them. (The engine core runs in this process, so the test
reads the executor's own account.)"""

from __future__ import annotations

import json
import os

import pytest

from actors import engine_args
from actors.sim.profile import GpuProfile, StepShape
from common.config import load_config

PROFILE = {"name": "test", "block_size": 16, "num_gpu_blocks": 512, "max_num_seqs": 4, "max_num_batched_tokens": 64,
           "kv_bytes_per_token": 1000, "kv_transfer_bytes_per_s": 1e9, "step_overhead_s": 0.0005,
           "prefill": {"context": [0, 2048], "s_per_token": [1e-5, 2e-5]},
           "decode": {"batch": [1, 4], "context": [16, 2048], "step_s": [[0.002, 0.003], [0.004, 0.006]]}}


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("sim") / "profile.json"
    path.write_text(json.dumps(PROFILE))
    old = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    cfg = load_config(None, environ={})
    engine = LLM(model=str(cfg.model.resolved_path()), block_size=16, max_model_len=1024, enforce_eager=True,
                 distributed_executor_backend="actors.sim.timed_executor.TimedExecutor",
                 additional_config={"baton_sim": {"profile": str(path), "speedup": 4.0}})
    yield engine
    engine.llm_engine.engine_core.shutdown()
    if old is None:
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    else:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = old


def _executor(llm):
    return llm.llm_engine.engine_core.engine_core.model_executor


def test_the_profiled_gpu_limits_replace_the_engines(llm):
    core = llm.llm_engine.engine_core.engine_core
    assert core.vllm_config.cache_config.num_gpu_blocks == 512
    assert core.scheduler.max_num_running_reqs == 4
    assert core.vllm_config.scheduler_config.max_num_batched_tokens == 64
    # admission's default permits per replica follow the profiled GPU (common/config/admission.py)
    assert engine_args.seqs_limit(llm.llm_engine.vllm_config) == 4


def test_one_request_takes_exactly_its_modelled_steps(llm):
    from vllm import SamplingParams

    ex = _executor(llm)
    before, steps0 = ex.busy_s, ex.steps
    prompt = list(range(10, 110))  # 100 tokens: chunks of 64 and 36, then 7 decode steps
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=8, temperature=0))[0]
    assert len(out.outputs[0].token_ids) == 8 and out.outputs[0].finish_reason == "length"
    p = GpuProfile(**{k: v for k, v in vars(ex.profile).items()})
    want = p.step_s(StepShape(prefill=[(0, 64)])) + p.step_s(StepShape(prefill=[(64, 100)]))
    want += sum(p.step_s(StepShape(decode_ctx=[101 + i])) for i in range(7))
    assert ex.steps - steps0 == 9
    assert ex.busy_s - before == pytest.approx(want / 4.0)


def test_a_repeated_prompt_hits_the_prefix_cache_and_answers_the_same(llm):
    from vllm import SamplingParams

    prompt = list(range(200, 300))
    a = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=5))[0]
    b = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=5))[0]
    assert b.num_cached_tokens == 96  # every full block of the 100-token prompt
    assert a.outputs[0].token_ids == b.outputs[0].token_ids  # seeded by the prompt


def test_a_grammar_constrains_the_modelled_tokens(llm):
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    sp = SamplingParams(max_tokens=40, structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    out = llm.generate({"prompt_token_ids": list(range(5, 40))}, sp)[0]
    assert out.outputs[0].text in ("yes", "no")
