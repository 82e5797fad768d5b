"""The CPU scheduler-step budget (actors/step_budget.py): a step's worth of time from the model's size."""

import json

import pytest

from actors.step_budget import FLOOR_TOKENS, VLLM_CPU_DEFAULT, cpu_step_tokens, flops_per_token, step_tokens
from cluster.default_model.tiny_model import SIZES

BENCH = {**SIZES["bench"], "vocab_size": 1024}


def test_flops_count_the_linear_layers_with_grouped_kv_heads():
    h, inter, layers = 1024, 2816, 8
    q_o, k_v = 2 * h * h, 2 * h * 8 * 64  # 16 query heads of 64; 8 KV heads
    assert flops_per_token(BENCH) == 2 * layers * (q_o + k_v + 3 * h * inter)
    assert flops_per_token({"hidden_size": 64}) is None  # not a Llama-shaped config


@pytest.mark.parametrize("flops, rate, expected", [
    (190e6, 75e9, FLOOR_TOKENS),          # the bench model, 2.5 ms a token: 100 tokens, floored
    (190e6, 500e9, 640),                  # the same model on a faster CPU: 0.38 ms a token
    (0.6e6, 25e9, VLLM_CPU_DEFAULT),      # the default model: thousands of tokens, capped at vLLM's default
])
def test_step_tokens_are_the_target_time_within_bounds(flops, rate, expected):
    assert step_tokens(flops, rate) == expected


def test_step_tokens_hold_a_token_per_sequence():
    assert step_tokens(190e6, 75e9, min_tokens=512) == 512


def test_cpu_step_tokens_from_a_checkpoint_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(BENCH))
    assert FLOOR_TOKENS <= cpu_step_tokens(tmp_path) < VLLM_CPU_DEFAULT  # ~190 MFLOP a token is slow on any CPU
    (tmp_path / "config.json").write_text(json.dumps({**BENCH, "hidden_size": 64, "intermediate_size": 128,
                                                      "num_hidden_layers": 1, "num_attention_heads": 1}))
    assert cpu_step_tokens(tmp_path) is None  # a tiny model keeps vLLM's default
    assert cpu_step_tokens(tmp_path / "missing") is None
