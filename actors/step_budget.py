"""How many prompt tokens one vLLM scheduler step may hold on CPU: a step's worth of time, not a count.

A scheduler step cannot be preempted. A prompt that arrives while one runs
waits for it, and then for the prompts ahead of it that fill the next
step's token budget. vLLM's CPU default budget (2048 tokens) is tens of
milliseconds of prefill for a small model and seconds for a larger one,
and there a session's cached turn (a few hundred new tokens) waits behind
whole recomputes of other prompts: `baton bench affinity` (8-layer model,
2.5 ms a prompt token on the 2-core VM) had turn-2+ TTFT p50 at 0.64x
round robin with 2048 and 0.50x with 256, five repeats each, the worst
repeat 0.97x and 0.70x (docs/benchmarks.md).

So on CPU the budget is the tokens whose prefill takes about STEP_TARGET_S
on this machine, between FLOOR_TOKENS and vLLM's CPU default: the model's
prefill FLOPs per token (its config.json) over a matrix multiply timed
here. Small models keep vLLM's default, so short prompts are not split
into more steps than vLLM would make. GPUs keep vLLM's default: 2048 tokens
are milliseconds there. A pool's `engine_args.max_num_batched_tokens`
overrides all of this.

`flops_per_token` and `step_tokens` are pure; `measured_flops_per_s` times torch.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)

STEP_TARGET_S = 0.25  # how long one step's prompt tokens may hold up a prompt that arrives during it
FLOOR_TOKENS = 256  # below this, per-step overheads dominate
VLLM_CPU_DEFAULT = 2048  # vLLM's max_num_batched_tokens on CPU (engine/arg_utils.py get_batch_defaults)


def flops_per_token(config: dict) -> float | None:
    """Multiply-add FLOPs of one prompt token through a Llama-shaped decoder's linear layers
    (attention projections and MLP; the logits are computed for the last token only). None when the
    config lacks the fields (another architecture): the caller keeps vLLM's default."""
    try:
        h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
        heads = config["num_attention_heads"]
    except KeyError:
        return None
    head_dim = config.get("head_dim") or h // heads
    kv = config.get("num_key_value_heads") or heads
    per_layer = 2 * h * heads * head_dim + 2 * h * kv * head_dim + 3 * h * inter  # q, o; k, v; gate, up, down
    return 2.0 * layers * per_layer


def step_tokens(flops: float, flops_per_s: float, min_tokens: int = 0, target_s: float = STEP_TARGET_S) -> int:
    """The step budget: tokens that take `target_s` at `flops` per token and `flops_per_s`, rounded
    down to a multiple of 64, within [FLOOR_TOKENS, VLLM_CPU_DEFAULT] and at least `min_tokens`
    (vLLM wants a token for each sequence a step may hold)."""
    tokens = int(target_s * flops_per_s / flops) // 64 * 64 if flops > 0 and flops_per_s > 0 else VLLM_CPU_DEFAULT
    return max(min_tokens, FLOOR_TOKENS, min(VLLM_CPU_DEFAULT, tokens))


@functools.cache
def measured_flops_per_s(m: int = 256, k: int = 1024, n: int = 1024, reps: int = 3) -> float:
    """Float32 matrix-multiply FLOP/s of this process's torch threads: the best of `reps` after one
    warm-up, measured once per process (a catalogue replica builds an engine at every wake)."""
    import torch

    a, b = torch.randn(m, k), torch.randn(k, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * m * k * n / best


def cpu_step_tokens(model_dir: Path, min_tokens: int = 0) -> int | None:
    """The step budget for the model in `model_dir` on this CPU; None (leave vLLM's default) when
    that is what it comes to, or when its config.json cannot be read or describes another architecture."""
    try:
        flops = flops_per_token(json.loads((Path(model_dir) / "config.json").read_text()))
    except (OSError, ValueError):
        return None
    if flops is None:
        return None
    rate = measured_flops_per_s()
    tokens = step_tokens(flops, rate, min_tokens)
    log.info("CPU step budget: %d prompt tokens (%.2f ms a token at %.0f GFLOP/s)", tokens, 1e3 * flops / rate,
             rate / 1e9)
    return None if tokens == VLLM_CPU_DEFAULT else tokens
