"""The copying model's trainer (cluster/default_model/train_copy.py) and the echo-rate measure (cluster/default_model/copy_eval.py) on hand-made
cases, and a few-step training run that lowers the loss and is cached by its inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.default_model import copy_eval, train_copy
from common.constants import CORPUS


def test_echo_rate_counts_tokens_whose_k_gram_is_in_the_prompt():
    prompt = [1, 2, 3, 4, 5, 6]
    # Every 3-gram of the answer is in the prompt; the first two tokens never count.
    assert copy_eval.echo_rate(prompt, [2, 3, 4, 5], k=3) == 2 / 4
    assert copy_eval.echo_rate(prompt, [7, 8, 9], k=3) == 0.0
    assert copy_eval.echo_rate(prompt, [], k=3) == 0.0
    # 1 2 3 is copied, then 2 3 9 and 3 9 4 do not occur: one hit in 5.
    assert copy_eval.echo_rate(prompt, [1, 2, 3, 9, 4], k=3) == 1 / 5
    # Looping over a span still continues spans of the prompt.
    assert copy_eval.echo_rate(prompt, [1, 2, 3, 1, 2, 3], k=3) == 2 / 6
    assert copy_eval.echo_rate(prompt, [1, 2, 3, 1, 2, 3], k=1) == 1.0


def test_echo_rate_k_gram_lies_in_the_answer_not_across_prompt_and_answer():
    # [5, 6] ends the prompt and the answer starts with 7: 5 6 7 is not a prompt 3-gram,
    # and the answer's own 3-grams are new, so nothing counts.
    assert copy_eval.echo_rate([5, 6, 7, 8], [7, 9, 10], k=3) == 0.0
    assert copy_eval.echo_rate([5, 6, 7, 8], [6, 7, 8], k=2) == 2 / 3


def test_corpus_split_holds_every_fifth_line_out():
    train, held = train_copy.split_corpus(CORPUS.read_text())
    assert held and train and not set(held) & set(train)
    assert len(held) == len([l for l in CORPUS.read_text().splitlines() if l.strip()]) // 5


def test_held_out_prompts_carry_their_tool_result():
    pairs = train_copy.heldout_prompts(6)
    assert pairs == train_copy.heldout_prompts(6)
    for msgs, result in pairs:
        assert result in msgs[-1]["content"]


SMOKE = dict(lr=3e-3, warmup=2, weight_decay=0.0, random_share=0.5,
             phases=[dict(steps=12, batch=4, max_len=40, seg_min=4, seg_max=8, plain=0.5, repeat=0.3)])


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("tok")
    train_copy.tiny_model._train_tokenizer(out)  # as the random model's, byte for byte
    return AutoTokenizer.from_pretrained(out)


def test_sequences_mask_the_prompt_and_end_the_answer_with_eos(tok):
    maker = train_copy.SequenceMaker(tok, train_copy.split_corpus(CORPUS.read_text())[0], 1, SMOKE)
    for _ in range(20):
        ids, labels = maker.copy_example()
        assert len(ids) == len(labels) and labels[-1] == tok.eos_token_id
        answer = [l for l in labels if l != -100][:-1]
        prompt = ids[:len(ids) - len(answer) - 1]
        assert copy_eval.echo_rate(prompt, answer, k=1) == 1.0  # every answer token is copied
        ids, labels = maker.chat_example()
        assert labels[-1] == tok.eos_token_id and len([l for l in labels if l != -100]) >= 9


def test_training_lowers_the_loss(tok):
    import torch

    torch.set_num_threads(1)
    hp = json.loads(json.dumps(SMOKE))
    hp["phases"][0].update(steps=30, plain=1.0, repeat=0.0)
    maker = train_copy.SequenceMaker(tok, train_copy.split_corpus(CORPUS.read_text())[0], 1, hp)
    losses = train_copy.train(train_copy.new_model(train_copy.ARCH["draft"], tok, 1), maker, hp,
                              log=lambda _: None)
    assert len(losses) == 30 and sum(losses[-5:]) / 5 < losses[0] - 1.0


def test_build_is_cached_by_its_inputs(tmp_path, tok):
    out = tmp_path / "m"
    first = train_copy.build(out, "draft", seed=7, hp=SMOKE, log=lambda _: None)
    assert not first["cached"] and first["steps"] == 12
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json",
            train_copy.MARKER} <= {p.name for p in out.iterdir()}
    assert (out / "tokenizer.json").read_bytes() == (Path(tok.name_or_path) / "tokenizer.json").read_bytes()
    weights = (out / "model.safetensors").stat().st_mtime_ns
    again = train_copy.build(out, "draft", seed=7, hp=SMOKE, log=lambda _: None)
    assert again["cached"] and (out / "model.safetensors").stat().st_mtime_ns == weights
    other = train_copy.build(out, "draft", seed=8, hp=SMOKE, log=lambda _: None)
    assert not other["cached"] and json.loads((out / train_copy.MARKER).read_text())["seed"] == 8


def test_same_seed_same_weights(tmp_path):
    a = train_copy.build(tmp_path / "a", "draft", seed=3, hp=SMOKE, log=lambda _: None)
    b = train_copy.build(tmp_path / "b", "draft", seed=3, hp=SMOKE, log=lambda _: None)
    assert a["final_loss"] == b["final_loss"]
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()


def test_committed_default_checkpoints_match_their_inputs():
    """The default model and its draft ship as committed checkpoints whose markers record the inputs;
    an edit of the corpus or the hyper-parameters without retraining (`python -m cluster.default_model.train_copy
    --out models/baton-tiny-copy --draft-out models/baton-tiny-copy-draft`) would make every fresh
    install train them again."""
    from common.constants import DEFAULT_MODEL_DIR, DRAFT_MODEL_DIR

    assert train_copy.built(DEFAULT_MODEL_DIR, "main") is not None
    assert train_copy.built(DRAFT_MODEL_DIR, "draft") is not None
    assert (DEFAULT_MODEL_DIR / "model.safetensors").stat().st_size > 2_000_000
