"""The default model: a deterministic tiny Llama, generated locally.

Nothing can be downloaded at run time, so Baton's default model is built here
from a fixed seed: a byte-level BPE tokenizer trained on a text shipped in the
repository, a chat template, and a 2-layer Llama with random weights. Any
HF-format checkpoint directory can be used instead through the config.

The weights are random, so the text it writes is nonsense; what matters is that
it is a real checkpoint vLLM serves, and that the same seed gives the same
bytes on every machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common.constants import CORPUS

SPECIAL_TOKENS = ["<|bos|>", "<|end|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SEED = 1234
VOCAB_SIZE = 1024
MAX_POSITIONS = 2048
MARKER = "baton_tiny_model.json"
# "tiny" is the default model; "bench" is a wider 8-layer Llama for
# benchmarks where recomputing a prompt should cost what it does on real models;
# "kv" has a realistic KV shape.
SIZES = {
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
    "bench": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                  num_attention_heads=16, num_key_value_heads=8),
    # The default catalogue's other models (cluster/catalogue.yaml): distinct sizes and layer counts.
    "small": dict(hidden_size=192, intermediate_size=384, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2),
    "medium": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                   num_attention_heads=8, num_key_value_heads=4),
    "wide": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=2,
                 num_attention_heads=6, num_key_value_heads=2),
    "deep": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=6,
                 num_attention_heads=4, num_key_value_heads=2),
    # About 0.75 B parameters (3 GiB in float32): big enough that loading weights, not
    # starting processes, is what a GPU engine start or a wake from sleep costs (bench/models/sleep_gpu.py).
    "gpu": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                num_attention_heads=16, num_key_value_heads=8),
    # The KV shape of a mid-sized production model (16 layers, 8 KV heads of
    # 128): 128 KiB of KV per token in float32, for `baton bench kv`.
    "kv": dict(hidden_size=1024, intermediate_size=2048, num_hidden_layers=16,
               num_attention_heads=8, num_key_value_heads=8, head_dim=128),
}


def _train_tokenizer(out: Path) -> int:
    """Writes tokenizer files into `out`; returns the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS.read_text()], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|end|>",
        pad_token="<|pad|>",
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return len(fast)


def _build_model(out: Path, vocab_size: int, bos_id: int, eos_id: int, size: str, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        **SIZES[size],
        max_position_embeddings=MAX_POSITIONS,
        # Wide logits keep greedy argmax far from ties, so tiny numerical
        # differences between batched prefill and decode never flip a token.
        initializer_range=0.25,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)


def generate(out: Path, force: bool = False, size: str = "tiny", seed: int = SEED) -> Path:
    """Creates the tiny model in `out` unless it is already complete there (same size and seed).

    Writes config, weights, tokenizer and chat template, then a marker file
    last, so an interrupted run is redone rather than half-used.
    """
    marker = out / MARKER
    if marker.exists() and not force and _same(marker, size, seed):
        return out
    out.mkdir(parents=True, exist_ok=True)
    vocab = _train_tokenizer(out)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    _build_model(out, vocab, tok.bos_token_id, tok.eos_token_id, size, seed)
    gen_cfg = out / "generation_config.json"
    if gen_cfg.exists():  # keep vLLM's defaults plain greedy-capable
        cfg = json.loads(gen_cfg.read_text())
        cfg.pop("do_sample", None)
        gen_cfg.write_text(json.dumps(cfg, indent=2))
    marker.write_text(json.dumps({"seed": seed, "vocab_size": vocab, "size": size}))
    return out


def _same(marker: Path, size: str, seed: int) -> bool:
    try:
        done = json.loads(marker.read_text())
    except ValueError:
        return False
    return done.get("size", "tiny") == size and done.get("seed", SEED) == seed


def generate_catalogue(entries, force: bool = False) -> list[Path]:
    """Generates every catalogue entry (common/config/models.py) that names no checkpoint of its own;
    entries already generated with the same size and seed are kept unless `force`. Prints one line per model."""
    out = []
    for i, entry in enumerate(e for e in entries if e.path is None):
        print(f"catalogue model {i + 1}: {entry.id} ({entry.generate.size}, seed {entry.generate.seed})", flush=True)
        out.append(generate(entry.resolved_path(), force, entry.generate.size, entry.generate.seed))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate Baton's default tiny model.")
    parser.add_argument("out", type=Path, help="directory to write the checkpoint into")
    parser.add_argument("--force", action="store_true", help="regenerate even if present")
    args = parser.parse_args(argv)
    if (args.out / MARKER).exists() and not args.force:
        print(f"model already present at {args.out}")
        return 0
    print(f"generating tiny model into {args.out} ...", flush=True)
    generate(args.out, force=args.force)
    print(f"model ready at {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
