"""Greedy tokens of a single plain (colocated) vLLM engine, for comparison.

Run as a script: prints `REFERENCE_JSON {"mode/name": {"prompt_ids", "token_ids"}}`
as JSON on the last line of stdout.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from common.config import load_config
    from tests.e2e import prompts

    cfg = load_config(sys.argv[1])
    path = str(cfg.model.resolved_path())
    tok = AutoTokenizer.from_pretrained(path)
    keys, batch = [], []
    for mode in ("plain", "stream", "first"):
        for name, messages in prompts.cases(mode).items():
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            keys.append(f"{mode}/{name}")
            batch.append(tok.encode(text, add_special_tokens=False))
    llm = LLM(path, dtype=cfg.model.dtype, block_size=cfg.model.block_size,
              max_model_len=cfg.model.max_model_len, enforce_eager=True,
              kv_cache_memory_bytes=2**30)
    params = SamplingParams(max_tokens=prompts.MAX_TOKENS, temperature=0)
    outs = llm.generate([{"prompt_token_ids": ids} for ids in batch], params)
    result = {k: {"prompt_ids": ids, "token_ids": list(o.outputs[0].token_ids)}
              for k, ids, o in zip(keys, batch, outs)}
    print("REFERENCE_JSON " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
