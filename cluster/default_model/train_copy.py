"""A default model that has learned to copy: train the tiny Llama (and a draft) locally.

The random model of cluster/default_model/tiny_model.py writes nonsense; this one is trained, from a
fixed seed and the corpus shipped in the repository (nothing is downloaded), to echo a
tool result it was shown: what speculative decoding by prompt lookup or by a draft exploits.

Data. Every `HELD_OUT_EVERY`-th corpus line is held out for the evaluation and never
trained on. Phase 1 is short repeated random tokens, where an induction head forms;
phase 2 is chats (the tokenizer's own template, the result as a `tool` message or pasted
into the user's) whose answer repeats a contiguous part of the result, loss on the answer
only, mixed with longer repeats, plain corpus text and chats without a tool result. A
result is text made from the training lines (a span, a word list, JSON, code-like) or
random vocabulary tokens, so copying is learnt as a mechanism for every token rather
than as a memory of the corpus.

Model. Two layers are the least that form an induction head (a previous-token head
feeding a matching head), so the main model keeps `tiny_model.SIZES["tiny"]` unchanged
and serves at the random model's cost. The draft has the same two layers at half the
width: in one layer a key sees only its own token, so no head can find "the token after
the last occurrence of this one". The tokenizer is the random model's, byte for byte.

Cache. `MARKER` in the output directory records the seed, the corpus's sha256, the
architecture and the hyper-parameters; a rerun with the same inputs does nothing.

Echo rate: cluster/default_model/copy_eval.py measures it on `heldout_prompts`; `main` prints it after
training. cluster/default_model/__init__.py trains what is missing of the default model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from pathlib import Path

from cluster.default_model import tiny_model
from cluster.default_model.copy_eval import evaluate
from common.constants import CORPUS
from common.progress import Progress

SEED = 1234
EVAL_SEED = 4321  # the held-out prompts do not change with the training seed
MARKER = "baton_train_copy.json"
HELD_OUT_EVERY = 5  # corpus lines 4, 9, 14, ... (0-based) are held out
ARCH = {
    "main": dict(tiny_model.SIZES["tiny"]),
    "draft": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1),
}
# Phase 1 (short repeats) ends once its loss is below `until_loss`: the induction head
# has formed (on long sequences, or at lr 3e-3, it did not form within the budget).
# Constant learning rate after the warm-up, cosine decay over the last phase.
_P1 = dict(until_loss=0.3, batch=32, max_len=48, seg_min=4, seg_max=16, plain=0.0, repeat=1.0)
_P2 = dict(batch=24, max_len=160, seg_min=8, seg_max=40, plain=0.15, repeat=0.25, chat=0.08)
_OPT = dict(lr=1e-3, warmup=30, weight_decay=0.01, random_share=0.4)
HPARAMS = {"main": dict(_OPT, phases=[dict(_P1, steps=1000), dict(_P2, steps=480)]),
           "draft": dict(_OPT, phases=[dict(_P1, steps=1600), dict(_P2, steps=700)])}
SYSTEMS = ["", "You answer with the tool's output.", "Repeat what the tools return."]
QUESTIONS = ["What did the tool return?", "Show me the result.", "Read the file.",
             "Look it up.", "Call the search tool.", "What does it say?", "Run it."]
PLACEHOLDER = "@@RESULT@@"


def corpus_sha256(path: Path = CORPUS) -> str:
    """The cache key's corpus part."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def split_corpus(text: str) -> tuple[list[str], list[str]]:
    """(training lines, held-out lines) of the corpus."""
    lines = [l for l in text.splitlines() if l.strip()]
    held = [l for i, l in enumerate(lines) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    return [l for i, l in enumerate(lines) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1], held


def result_text(rng: random.Random, lines: list[str]) -> str:
    """A tool result made from `lines`: a span of lines, a word list, JSON or code-like text."""
    words = [w for w in (x.strip(".,;!?\"'()") for l in lines for x in l.split()) if w]
    pick = lambda n: [rng.choice(words) for _ in range(n)]  # noqa: E731
    kind = rng.randrange(4)
    if kind == 0:
        i = rng.randrange(len(lines))
        text = " ".join(lines[i:i + rng.randint(1, 2)]).split()
        start = rng.randrange(max(1, len(text) - 8))
        return " ".join(text[start:start + rng.randint(6, 30)])
    if kind == 1:
        return rng.choice([", ", " ", "\n"]).join(pick(rng.randint(4, 14)))
    if kind == 2:
        obj = {w: " ".join(pick(rng.randint(1, 3))) for w in pick(rng.randint(1, 4))}
        if rng.random() < 0.5:
            obj["items"] = pick(rng.randint(1, 4))
        return json.dumps(obj)
    a, b, c = pick(3)
    return rng.choice([f'def {a}({b}): return "{" ".join(pick(4))}"',
                       f"{a} = {b}({c}, {rng.randint(0, 999)})",
                       f"<{a}>{' '.join(pick(5))}</{a}>"])


def messages_for(rng: random.Random, result: str) -> list[dict]:
    """A chat carrying `result` as a tool message (or pasted in the user's), before the answer."""
    system, question = rng.choice(SYSTEMS), rng.choice(QUESTIONS)
    msgs = [{"role": "system", "content": system}] if system else []
    if rng.random() < 0.7:
        return msgs + [{"role": "user", "content": question}, {"role": "tool", "content": result}]
    return msgs + [{"role": "user", "content": f"{question}\n{result}"}]


class SequenceMaker:
    """Training sequences (input ids, labels) from the training lines, seeded."""

    def __init__(self, tok, lines: list[str], seed: int, hp: dict):
        self.tok, self.lines, self.hp, self.eos = tok, lines, hp, tok.eos_token_id
        self.rng = random.Random(seed)
        special = set(tok.all_special_ids)
        self.vocab = [i for i in range(len(tok)) if i not in special]
        self.corpus_ids = tok("\n".join(lines), add_special_tokens=False)["input_ids"]
        self._pieces: dict[str, tuple[list[int], list[int]]] = {}

    def _enc(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def _scaffold(self, msgs: list[dict]) -> tuple[list[int], list[int]]:
        key = json.dumps(msgs)
        if key not in self._pieces:
            text = self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            before, after = text.split(PLACEHOLDER)
            self._pieces[key] = (self._enc(before), self._enc(after))
        return self._pieces[key]

    def copy_example(self) -> tuple[list[int], list[int]]:
        rng = self.rng
        if rng.random() < self.hp["random_share"]:
            pool = self.vocab if rng.random() < 0.5 else self.corpus_ids
            result = [rng.choice(pool) for _ in range(rng.randint(6, 40))]
        else:
            result = self._enc(result_text(rng, self.lines))[:60]
        before, after = self._scaffold(messages_for(rng, PLACEHOLDER))
        start = 0 if rng.random() < 0.85 else rng.randrange(len(result) // 2 + 1)
        end = len(result) if rng.random() < 0.85 else rng.randint(max(start + 1, (start + len(result)) // 2), len(result))
        answer = result[start:end] + [self.eos]
        prompt = before + result + after
        return prompt + answer, [-100] * len(prompt) + answer

    def chat_example(self) -> tuple[list[int], list[int]]:
        """A chat without a tool result, answered with one or two training lines."""
        rng, system = self.rng, self.rng.choice(SYSTEMS)
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": rng.choice(self.lines)[:rng.randint(10, 80)]}]
        prompt = self._enc(self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
        i = rng.randrange(len(self.lines))
        answer = self._enc("\n".join(self.lines[i:i + rng.randint(1, 2)]))[:48] + [self.eos]
        return prompt + answer, [-100] * len(prompt) + answer

    def repeat_example(self, phase: dict) -> tuple[list[int], list[int]]:
        """Random tokens, then the same tokens again and again (the induction-head task)."""
        rng = self.rng
        seg = [rng.choice(self.vocab) for _ in range(rng.randint(phase["seg_min"], phase["seg_max"]))]
        ids, labels = [self.tok.bos_token_id] + seg, [-100] * (len(seg) + 1)
        while len(ids) + len(seg) <= phase["max_len"]:
            ids, labels = ids + seg, labels + seg
        return ids, labels

    def plain_example(self, phase: dict) -> tuple[list[int], list[int]]:
        """A window of the training lines, every token a target."""
        start = self.rng.randrange(len(self.corpus_ids))
        ids = [self.tok.bos_token_id] + (self.corpus_ids * 2)[start:start + phase["max_len"] - 1]
        return ids, list(ids)

    def example(self, phase: dict) -> tuple[list[int], list[int]]:
        r = self.rng.random()
        if r < phase["plain"]:
            return self.plain_example(phase)
        if r < phase["plain"] + phase["repeat"]:
            return self.repeat_example(phase)
        if r < phase["plain"] + phase["repeat"] + phase.get("chat", 0.0):
            return self.chat_example()
        return self.copy_example()

    def batch(self, phase: dict):
        """One right-padded batch of `phase`: input_ids, attention_mask, labels (torch tensors)."""
        import torch

        rows = [self.example(phase) for _ in range(phase["batch"])]
        rows = [(ids[:phase["max_len"]], lab[:phase["max_len"]]) for ids, lab in rows]
        width = max(len(ids) for ids, _ in rows)
        pad = self.tok.pad_token_id
        ids = torch.tensor([r + [pad] * (width - len(r)) for r, _ in rows])
        labels = torch.tensor([l + [-100] * (width - len(l)) for _, l in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r, _ in rows])
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def new_model(arch: dict, tok, seed: int):
    """A freshly initialised LlamaForCausalLM of `arch`, sharing the tokenizer's ids."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), **arch, max_position_embeddings=tiny_model.MAX_POSITIONS,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, tie_word_embeddings=False, torch_dtype="float32")
    return LlamaForCausalLM(config)


def lr_factor(step: int, hp: dict) -> float:
    """Linear warm-up, constant, then cosine decay to zero over the last phase."""
    total = sum(p["steps"] for p in hp["phases"])
    decay_from = total - hp["phases"][-1]["steps"]
    warm = min(1.0, (step + 1) / hp["warmup"])
    if step < decay_from:
        return warm
    return warm * 0.5 * (1 + math.cos(math.pi * (step - decay_from) / max(1, total - decay_from)))


def train(model, maker: SequenceMaker, hp: dict, log=print) -> list[float]:
    """Trains `model` in place through hp["phases"] (AdamW, `lr_factor`); returns every step's loss.

    A phase with `until_loss` ends early once its mean loss over 20 steps falls below it
    (the induction head has formed); the learning-rate schedule counts its full length."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=hp["lr"], betas=(0.9, 0.98),
                            weight_decay=hp["weight_decay"])
    model.train()
    losses, start, cpu, step_no = [], time.monotonic(), time.process_time(), 0
    for i, phase in enumerate(hp["phases"]):
        every = max(1, phase["steps"] // 5)
        for step in range(phase["steps"]):
            for group in opt.param_groups:
                group["lr"] = hp["lr"] * lr_factor(step_no + step, hp)
            loss = model(**maker.batch(phase)).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            done = len(losses) >= 20 and sum(losses[-20:]) / 20 < phase.get("until_loss", -1)
            if (step + 1) % every == 0 or done or step + 1 == phase["steps"]:
                log(f"    phase {i + 1} step {step + 1}/{phase['steps']}  loss {sum(losses[-20:]) / 20:.3f}"
                    f"  ({time.process_time() - cpu:.0f}s CPU, {time.monotonic() - start:.0f}s wall)")
            if done:
                break
        step_no += phase["steps"]
    model.eval()
    return losses


def _inputs(role: str, seed: int, hp: dict) -> dict:
    return {"role": role, "seed": seed, "corpus_sha256": corpus_sha256(), "arch": ARCH[role],
            "vocab_size": tiny_model.VOCAB_SIZE, "held_out_every": HELD_OUT_EVERY, "hparams": hp}


def built(out: Path, role: str = "main", seed: int = SEED, hp: dict | None = None) -> dict | None:
    """The marker in `out` if it records a finished training with these inputs (role, seed, the
    corpus's hash, architecture, hyperparameters), else None. Reads files only (no torch)."""
    marker = out / MARKER
    if not marker.exists():
        return None
    done = json.loads(marker.read_text())
    want = json.loads(json.dumps(_inputs(role, seed, hp or HPARAMS[role])))
    return done if {k: done.get(k) for k in want} == want else None


def build(out: Path, role: str = "main", seed: int = SEED, hp: dict | None = None,
          force: bool = False, log=print) -> dict:
    """Trains the `role` model ("main" or "draft") into `out` as an HF checkpoint with the
    random model's tokenizer, unless `MARKER` there already records the same inputs.
    Returns the marker's content plus `cached`. One torch thread: deterministic, and the
    time recorded is the budget measured."""
    hp = hp or HPARAMS[role]
    want = _inputs(role, seed, hp)
    if not force and (done := built(out, role, seed, hp)) is not None:
        return dict(done, cached=True)
    import torch
    from transformers import AutoTokenizer

    marker = out / MARKER
    out.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tiny_model._train_tokenizer(out)
        tok = AutoTokenizer.from_pretrained(out)
        model = new_model(ARCH[role], tok, seed)
        cpu, wall = time.process_time(), time.monotonic()
        losses = train(model, SequenceMaker(tok, split_corpus(CORPUS.read_text())[0], seed, hp), hp, log)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(out, safe_serialization=True)
    gen_cfg = out / "generation_config.json"
    if gen_cfg.exists():  # as the random model's: plain, greedy-capable defaults
        gen_cfg.write_text(json.dumps({k: v for k, v in json.loads(gen_cfg.read_text()).items()
                                       if k != "do_sample"}, indent=2))
    done = dict(want, params=sum(p.numel() for p in model.parameters()), steps=len(losses),
                final_loss=round(sum(losses[-20:]) / len(losses[-20:]), 4),
                train_cpu_s=round(cpu, 1), train_wall_s=round(wall, 1), torch=torch.__version__)
    marker.write_text(json.dumps(done, indent=2))
    return dict(done, cached=False)


def heldout_prompts(n: int = 40, seed: int = EVAL_SEED) -> list[tuple[list[dict], str]]:
    """`n` (chat, tool result) pairs whose result is made from the held-out corpus lines only."""
    rng, held = random.Random(seed), split_corpus(CORPUS.read_text())[1]
    pairs = []
    for _ in range(n):
        result = result_text(rng, held)
        pairs.append((messages_for(rng, result), result))
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train Baton's copying tiny model (and a draft); "
                                     "print the echo rates on held-out tool-result prompts as JSON.")
    parser.add_argument("--out", type=Path, required=True, help="checkpoint directory of the model")
    parser.add_argument("--draft-out", type=Path, help="checkpoint directory of the draft model")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--prompts", type=int, default=40, help="held-out prompts to measure on")
    parser.add_argument("--force", action="store_true", help="retrain even if cached")
    args = parser.parse_args(argv)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    progress = Progress(2 + bool(args.draft_out), out=sys.stderr)
    built = {}
    for role, out in (("main", args.out), ("draft", args.draft_out)):
        if out is not None:
            with progress.step(f"{role} model into {out} (cached if trained before)"):
                built[role] = build(out, role, args.seed, force=args.force, log=log)
    with progress.step(f"echo rates on {args.prompts} held-out tool-result prompts"):
        report = evaluate(args.out, args.draft_out, heldout_prompts(args.prompts))
    for role, done in built.items():
        report[role].update({k: done[k] for k in ("params", "steps", "train_cpu_s", "train_wall_s",
                                                  "final_loss", "cached")})
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
