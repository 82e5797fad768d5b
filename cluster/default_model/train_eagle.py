"""An EAGLE draft head for the default model, trained here: `python -m cluster.default_model.train_eagle`.

EAGLE (Li et al., 2024) drafts from the target's own features. At position t
the head takes the target's last hidden state h_t (after its final norm: what
vLLM hands a drafter) and the embedding of the next token x_{t+1}, maps them
through `fc` (2H -> H) and one Llama decoder layer without its input norm;
the target's lm_head reads the result for x_{t+2}, and the result is the
feature of the next draft step. vLLM's EagleLlamaForCausalLM loads it
(`speculation: {method: eagle, draft_model: models/baton-tiny-copy-eagle}`):
the checkpoint holds `fc` and the layer (`layers.0`), and shares the
target's embed_tokens and lm_head.

Trained by distillation on the copy-training data (cluster/default_model/train_copy.py's
SequenceMaker): cross-entropy against the target's own greedy next token,
plus a feature regression to h_{t+1}. Like the copying model, its checkpoint
is committed with a marker of its inputs; a build whose inputs match does
nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cluster.default_model import train_copy
from common.constants import CORPUS, DEFAULT_MODEL_DIR
from common.constants import EAGLE_MODEL_DIR as EAGLE_DIR
MARKER = "baton_train_eagle.json"
# As the copying model's schedule (cluster/default_model/train_copy.py): repeats first, where the head's own
# induction (find the last occurrence of the next token, read what followed it) forms, then the mix.
_P1 = {"batch": 32, "max_len": 48, "seg_min": 4, "seg_max": 16, "plain": 0.0, "repeat": 1.0, "steps": 800}
_P2 = {"batch": 24, "max_len": 160, "seg_min": 8, "seg_max": 40, "plain": 0.15, "repeat": 0.25, "chat": 0.08,
       "steps": 400}
HP = {"lr": 3e-3, "warmup": 30, "feature_weight": 0.1, "random_share": 0.4, "phases": [_P1, _P2]}


def _head(config):
    """The trainable head: fc and one decoder layer (transformers' Llama layer, input norm removed)."""
    import torch
    import torch.nn as nn
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            h = config.hidden_size
            self.fc = nn.Linear(2 * h, h, bias=False)
            self.layer = LlamaDecoderLayer(config, layer_idx=0)
            self.layer.input_layernorm = nn.Identity()
            self.rotary = LlamaRotaryEmbedding(config)

        def forward(self, embeds, features, positions):
            x = self.fc(torch.cat((embeds, features), dim=-1))
            out = self.layer(x, position_ids=positions, position_embeddings=self.rotary(x, positions))
            return out[0] if isinstance(out, tuple) else out

    return Head()


def _inputs(seed: int, hp: dict) -> dict:
    return {"seed": seed, "target_marker": train_copy.built(DEFAULT_MODEL_DIR, "main"), "hparams": hp}


def built(out: Path = EAGLE_DIR, seed: int = train_copy.SEED) -> dict | None:
    """The marker in `out` if it records a head trained with these inputs (the target's own marker
    included), else None. Reads files only."""
    marker = out / MARKER
    if not marker.exists():
        return None
    done = json.loads(marker.read_text())
    want = json.loads(json.dumps(_inputs(seed, HP)))
    return done if {k: done.get(k) for k in want} == want else None


def build(out: Path = EAGLE_DIR, seed: int = train_copy.SEED, steps: int | None = None, log=print) -> dict:
    """Trains the head for the default model into `out` (unless its marker matches); returns the
    marker plus `cached`. Writes config.json, model.safetensors and the marker, the marker last."""
    if steps is None and (done := built(out, seed)) is not None:
        return dict(done, cached=True)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    target = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_DIR, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)
    config = target.config.__class__(**{**target.config.to_dict(), "num_hidden_layers": 1})
    config._attn_implementation = "sdpa"  # causal without a mask (eager would attend to later tokens)
    head = _head(config)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    maker = train_copy.SequenceMaker(tok, train_copy.split_corpus(CORPUS.read_text())[0], seed, HP)
    opt = torch.optim.AdamW(head.parameters(), lr=HP["lr"], weight_decay=0.01)
    hp = HP if steps is None else {**HP, "phases": [dict(p, steps=max(1, steps // 2)) for p in HP["phases"]]}
    schedule = [p for p in hp["phases"] for _ in range(p["steps"])]
    n_steps, losses = len(schedule), []
    cpu, wall = time.process_time(), time.monotonic()
    try:
        for step, phase in enumerate(schedule):
            batch = maker.batch(phase)
            ids, real = batch["input_ids"], batch["attention_mask"][:, 1:].bool()
            with torch.no_grad():
                feats = target(input_ids=ids, attention_mask=batch["attention_mask"],
                               output_hidden_states=True).hidden_states[-1]  # after the final norm
                greedy = lm_head(feats).argmax(-1)  # the target's next token at every position
            positions = torch.arange(ids.shape[1] - 1).unsqueeze(0).expand(ids.shape[0], -1)
            f = head(embed(ids[:, 1:]), feats[:, :-1], positions)  # predicts x_{t+2} from (h_t, x_{t+1})
            ce = torch.nn.functional.cross_entropy(lm_head(f)[real], greedy[:, 1:][real])
            reg = torch.nn.functional.smooth_l1_loss(f[real], feats[:, 1:][real])
            loss = ce + HP["feature_weight"] * reg
            for group in opt.param_groups:
                group["lr"] = HP["lr"] * train_copy.lr_factor(step, hp)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(ce.item())
            if step % 100 == 0:
                log(f"eagle step {step}/{n_steps}: next-token loss {ce.item():.3f}")
    finally:
        torch.set_num_threads(threads)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    # The hyper-parameters used: a shortened --steps run is never taken for the full training.
    done = dict(_inputs(seed, hp), steps=n_steps, final_loss=round(sum(losses[-20:]) / len(losses[-20:]), 4),
                train_cpu_s=round(cpu, 1), train_wall_s=round(wall, 1), torch=torch.__version__)
    _save(out, head, config, done)
    return dict(done, cached=False)


def _save(out: Path, head, config, done: dict) -> None:
    """Writes the head as vLLM's EagleLlamaForCausalLM reads it, then the marker `done`."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).unlink(missing_ok=True)
    weights = {"fc.weight": head.fc.weight}
    weights.update({f"layers.0.{k}": v for k, v in head.layer.state_dict().items()
                    if not k.startswith("input_layernorm")})
    save_file({k: v.detach().contiguous() for k, v in weights.items()}, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(dict(config.to_dict(), architectures=["LlamaForCausalLM"]), indent=2))
    (out / MARKER).write_text(json.dumps(done, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=EAGLE_DIR)
    parser.add_argument("--steps", type=int, help="train this many steps even if cached (a quick check)")
    args = parser.parse_args(argv)
    done = build(args.out, steps=args.steps, log=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps({k: done[k] for k in ("steps", "final_loss", "train_cpu_s", "train_wall_s", "cached")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
