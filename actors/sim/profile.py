"""A GPU's step times for one model: what the timed executor sleeps per step.

A profile is a JSON file (actors/sim/profiles/) with:

- `prefill`: seconds per prompt token, by the context length at which the
  token is computed (attention grows with context);
- `decode`: one decode step's seconds, by batch size and mean context;
- `step_overhead_s`: a fixed cost per step (launch, sampling);
- the GPU's KV capacity (`block_size`, `num_gpu_blocks`), `max_num_seqs`,
  `max_num_batched_tokens`, and `kv_bytes_per_token` with
  `kv_transfer_bytes_per_s` for a disaggregated KV hop;
- `sources`: where each figure comes from.

Pure: no vLLM, torch or Ray import, and no clock; `StepShape` says what a
step computed and `step_s` prices it. Grids interpolate linearly and clamp at
their ends (a profile should cover the contexts it is used at).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
from pathlib import Path

PROFILES = Path(__file__).parent / "profiles"
DEFAULT = "h100_llama31_8b"


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """ys at x, linear between grid points, clamped at the ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1 = xs[i - 1], xs[i]
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)


@dataclasses.dataclass
class StepShape:
    """What one scheduler step computes: `decode_ctx`, the context of each sequence decoding one token;
    `prefill`, (first, last) context positions of each prompt chunk. (KV arriving over a transfer
    overlaps the steps: actors/sim/timed_executor.py times it apart, with `kv_transfer_s`.)"""

    decode_ctx: list[int] = dataclasses.field(default_factory=list)
    prefill: list[tuple[int, int]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class GpuProfile:
    name: str
    block_size: int
    num_gpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_bytes_per_token: int
    kv_transfer_bytes_per_s: float
    prefill_context: list[float]
    prefill_s_per_token: list[float]
    decode_batch: list[float]
    decode_context: list[float]
    decode_step_s: list[list[float]]  # [batch][context]
    step_overhead_s: float = 0.0
    kind: str = "published"
    gpu: str = ""
    model: str = ""
    sources: list = dataclasses.field(default_factory=list)

    @classmethod
    def load(cls, name_or_path: str | Path = DEFAULT) -> "GpuProfile":
        """The profile named (a file in actors/sim/profiles/, without .json) or at a path. Raises
        ValueError naming the file and the field when a grid is missing or malformed."""
        path = Path(name_or_path)
        if not path.suffix:
            path = PROFILES / f"{name_or_path}.json"
        doc = json.loads(path.read_text())
        try:
            prof = cls(
                name=doc["name"], block_size=int(doc["block_size"]), num_gpu_blocks=int(doc["num_gpu_blocks"]),
                max_num_seqs=int(doc["max_num_seqs"]), max_num_batched_tokens=int(doc["max_num_batched_tokens"]),
                kv_bytes_per_token=int(doc["kv_bytes_per_token"]),
                kv_transfer_bytes_per_s=float(doc["kv_transfer_bytes_per_s"]),
                prefill_context=[float(x) for x in doc["prefill"]["context"]],
                prefill_s_per_token=[float(x) for x in doc["prefill"]["s_per_token"]],
                decode_batch=[float(x) for x in doc["decode"]["batch"]],
                decode_context=[float(x) for x in doc["decode"]["context"]],
                decode_step_s=[[float(x) for x in row] for row in doc["decode"]["step_s"]],
                step_overhead_s=float(doc.get("step_overhead_s", 0.0)), kind=doc.get("kind", "published"),
                gpu=doc.get("gpu", ""), model=doc.get("model", ""), sources=doc.get("sources", []))
        except (KeyError, TypeError) as e:
            raise ValueError(f"GPU profile {path}: missing or malformed field {e}") from None
        prof.check(str(path))
        return prof

    def check(self, where: str) -> None:
        """Raises ValueError (naming `where` and the grid) unless every grid is sorted, sized to its axes
        and non-decreasing along them."""
        def rising(xs, what):
            if not xs or any(b < a for a, b in zip(xs, xs[1:])):
                raise ValueError(f"GPU profile {where}: {what} must be non-empty and non-decreasing")

        rising(self.prefill_context, "prefill.context")
        rising(self.decode_batch, "decode.batch")
        rising(self.decode_context, "decode.context")
        if len(self.prefill_s_per_token) != len(self.prefill_context):
            raise ValueError(f"GPU profile {where}: prefill.s_per_token needs one value per context")
        if len(self.decode_step_s) != len(self.decode_batch) or any(
                len(row) != len(self.decode_context) for row in self.decode_step_s):
            raise ValueError(f"GPU profile {where}: decode.step_s must be [batch][context]")
        for row in self.decode_step_s:
            rising(row, "decode.step_s along context")
        for col in zip(*self.decode_step_s):
            rising(list(col), "decode.step_s along batch")

    def prefill_s(self, first: int, last: int) -> float:
        """Seconds to compute prompt positions first..last-1 (each token priced at its own context;
        the chunk's middle stands for all of it)."""
        n = last - first
        if n <= 0:
            return 0.0
        return n * _interp(self.prefill_context, self.prefill_s_per_token, (first + last) / 2)

    def decode_s(self, batch: int, mean_ctx: float) -> float:
        """One decode step of `batch` sequences at `mean_ctx` tokens of context (bilinear)."""
        if batch <= 0:
            return 0.0
        bs, cs = self.decode_batch, self.decode_context
        by_ctx = [_interp(cs, row, mean_ctx) for row in self.decode_step_s]
        return _interp(bs, by_ctx, batch)

    def kv_transfer_s(self, tokens: int) -> float:
        """Seconds to move `tokens` tokens of KV between two GPUs at the profiled link rate."""
        return tokens * self.kv_bytes_per_token / self.kv_transfer_bytes_per_s if tokens > 0 else 0.0

    def step_s(self, shape: StepShape) -> float:
        """The GPU's seconds for one step: the decode batch, each prefill chunk, and the fixed overhead.
        Additive: a mixed step reads the weights twice in this model, an upper bound on a real fused
        step."""
        if not shape.decode_ctx and not shape.prefill:
            return 0.0
        t = self.step_overhead_s
        if shape.decode_ctx:
            t += self.decode_s(len(shape.decode_ctx), sum(shape.decode_ctx) / len(shape.decode_ctx))
        return t + sum(self.prefill_s(a, b) for a, b in shape.prefill)


def engine_rates(profile: GpuProfile, busy: float = 0.7, new_tokens: int = 1024, output_tokens: int = 256,
                 batch: int = 64, ctx: int = 4096) -> dict:
    """What one engine of `profile` stores per second under a chat workload using `busy` of its
    time: each request computes `new_tokens` at `ctx` context and decodes `output_tokens` in a
    batch of `batch`; every full block of either is stored. Pure."""
    step_s = profile.decode_s(batch, ctx) + profile.step_overhead_s
    per_request_s = profile.prefill_s(ctx - new_tokens, ctx) + output_tokens * step_s / batch
    requests = busy / per_request_s
    full = profile.block_size / profile.prefill_s(0, profile.block_size)
    return {"requests_per_s": round(requests, 2), "step_ms": round(step_s * 1000, 2),
            "blocks_per_s": round(requests * (new_tokens + output_tokens) / profile.block_size, 1),
            "full_prefill_blocks_per_s": round(full / profile.block_size, 1)}
