"""How well the copying model of cluster/default_model/train_copy.py copies: greedy echo rates on held-out
tool-result prompts (transformers' generate), and how much of its answer a draft predicts.
`python -m cluster.default_model.train_copy` prints these after training; docs/default_model.md has them.

Echo rate (`echo_rate`): the share of the answer's tokens t_i (eos excluded) whose
`ECHO_K`-gram t_{i-K+1..i} lies within the answer and occurs contiguously in the prompt;
the first K-1 answer tokens never count."""

from __future__ import annotations

import tempfile
from pathlib import Path

from cluster.default_model import tiny_model

ECHO_K = 3


def echo_rate(prompt: list[int], answer: list[int], k: int = ECHO_K) -> float:
    """Fraction of `answer` tokens t_i whose k-gram t_{i-k+1..i} (all within the answer)
    occurs contiguously in `prompt`; 0.0 for an empty answer. Strip eos before calling."""
    if not answer:
        return 0.0
    grams = {tuple(prompt[j:j + k]) for j in range(len(prompt) - k + 1)}
    hits = sum(tuple(answer[i - k + 1:i + 1]) in grams for i in range(k - 1, len(answer)))
    return hits / len(answer)


def greedy_echo(model, tok, pairs, max_new_tokens: int = 64) -> dict:
    """Greedy answers (transformers generate) of `model` to `pairs`: the mean echo rate, the
    share of answers that are the tool result exactly, and the (prompt, answer) token ids."""
    import torch

    rates, exact, seqs = [], 0, []
    for msgs, result in pairs:
        prompt = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)["input_ids"]
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        answer = [t for t in out[0, len(prompt):].tolist() if t != tok.eos_token_id]
        rates.append(echo_rate(prompt, answer))
        exact += tok.decode(answer) == result
        seqs.append((prompt, answer))
    return {"echo_rate": round(sum(rates) / len(rates), 4), "exact": round(exact / len(pairs), 4),
            "seqs": seqs}


def agreement(draft, seqs) -> float:
    """Share of the target's greedy answer tokens that `draft` also predicts greedily from the
    same prefix (teacher-forced): what speculative decoding with it would accept."""
    import torch

    hits = total = 0
    for prompt, answer in seqs:
        if answer:
            with torch.no_grad():
                logits = draft(torch.tensor([prompt + answer])).logits[0]
            guess = logits[len(prompt) - 1:len(prompt) + len(answer) - 1].argmax(-1).tolist()
            hits += sum(g == a for g, a in zip(guess, answer))
            total += len(answer)
    return round(hits / max(1, total), 4)


def evaluate(main_dir: Path, draft_dir: Path | None, pairs: list[tuple[list[dict], str]]) -> dict:
    """Echo rates on `pairs`, the held-out (chat, tool result) pairs of cluster/default_model/train_copy.py's
    `heldout_prompts`: trained model, draft, random model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(main_dir)
    load = lambda d: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()  # noqa: E731
    report = {"prompts": len(pairs), "k": ECHO_K, "main": greedy_echo(load(main_dir), tok, pairs)}
    if draft_dir:
        draft = load(draft_dir)
        report["draft"] = greedy_echo(draft, tok, pairs)
        report["draft"]["agreement"] = agreement(draft, report["main"]["seqs"])
    with tempfile.TemporaryDirectory() as tmp:
        report["random"] = greedy_echo(load(tiny_model.generate(Path(tmp))), tok, pairs)
    for part in ("main", "draft", "random"):
        report.get(part, {}).pop("seqs", None)
    return report
