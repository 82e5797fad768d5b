"""Speculative decoding of a pool: `<pool>.speculation` in the config.

Absent (null), the pool's engines decode one token per step. Present, each
engine of the pool proposes `num_speculative_tokens` tokens per step and the
target model verifies them in one pass; greedy output is unchanged.

Methods (vLLM's speculative decoding, all of them wired in its CPU model
runner as well as on GPUs):

- `ngram`: prompt lookup. The last `prompt_lookup_min`..`prompt_lookup_max`
  tokens are searched for earlier in the prompt and output, and what followed
  them there is proposed. No second model; pays off where answers repeat
  their context (agents echoing tool output, code, JSON). On a CUDA GPU it
  runs as vLLM's `ngram_gpu`: the same lookup on the GPU, which keeps
  vLLM's async scheduling on (the CPU lookup turns it off; measured on an
  H200 in docs/bench_spec.md).
- `draft`: a small model of the same tokenizer (`draft_model`, a local
  directory) proposes; `cluster/default_model/train_copy.py` trains one for the default
  copying model.
- `eagle`: an EAGLE head (`draft_model`) trained on the target's hidden
  states; `cluster/default_model/train_eagle.py` trains `models/baton-tiny-copy-eagle`
  for the default model.

In a disaggregated deployment, speculation belongs to the decode pool: the
prefill pool computes the prompt and one token and loads the target alone;
the decode pool loads the target and, for `draft` and `eagle`, the draft.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from common.config.base import _Strict

VLLM_METHOD = {"ngram": "ngram", "draft": "draft_model", "eagle": "eagle"}


class SpeculationConfig(_Strict):
    method: Literal["ngram", "draft", "eagle"] = Field(
        description="ngram: prompt lookup, no second model; draft: a small model proposes; eagle: an EAGLE head")
    num_speculative_tokens: int = Field(4, ge=1, le=16, description="tokens proposed per step")
    prompt_lookup_min: int = Field(2, ge=1, description="ngram: shortest suffix searched for in the context")
    prompt_lookup_max: int = Field(4, ge=1, description="ngram: longest suffix searched for in the context")
    draft_model: str | None = Field(
        None, description="draft, eagle: the proposing model's local directory (with config.json)")

    @model_validator(mode="after")
    def _method_fields(self) -> "SpeculationConfig":
        if self.method == "ngram" and self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("prompt_lookup_min must not exceed prompt_lookup_max")
        if self.method != "ngram" and not self.draft_model:
            raise ValueError(f"method {self.method} needs draft_model (a local model directory)")
        return self

    def missing_draft(self) -> str | None:
        """Why `draft_model` cannot be loaded (no directory, no config.json), or None. Reads the disk."""
        if self.method == "ngram":
            return None
        path = Path(self.draft_model).expanduser()
        if not path.is_dir():
            return f"{self.draft_model}: no such directory"
        if not (path / "config.json").is_file():
            return f"{self.draft_model}: no config.json there"
        return None

    def vllm(self, gpu: bool = False) -> dict[str, Any]:
        """vLLM's `speculative_config` for this section; `gpu`: for an engine on a CUDA GPU, where
        `ngram` runs as vLLM's `ngram_gpu` (the lookup on the GPU, async scheduling kept on)."""
        method = "ngram_gpu" if gpu and self.method == "ngram" else VLLM_METHOD[self.method]
        out: dict[str, Any] = {"method": method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.method == "ngram":
            out.update(prompt_lookup_min=self.prompt_lookup_min, prompt_lookup_max=self.prompt_lookup_max)
        else:
            out["model"] = str(Path(self.draft_model).expanduser())
        return out
