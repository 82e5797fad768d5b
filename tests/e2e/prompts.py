"""Deterministic chat prompts of several lengths, shared by the e2e tests and the
`vllm serve` reference (conftest.py `vllm_answers`). Each has a unique opening
line, so no engine has seen its prefix before the test sends it."""

from __future__ import annotations

from common.constants import CORPUS as CORPUS_FILE

CORPUS = CORPUS_FILE.read_text().split()


def make(tag: str, words: int) -> list[dict]:
    body = " ".join(CORPUS[i % len(CORPUS)] for i in range(words))
    return [
        {"role": "system", "content": f"Case {tag}. You are a helpful assistant."},
        {"role": "user", "content": body},
    ]


# (name, number of corpus words): shorter than one 32-token block, a few
# blocks, and many blocks (about 40).
LENGTHS = {"short": 1, "medium": 60, "long": 900}
MAX_TOKENS = 12


def cases(mode: str) -> dict[str, list[dict]]:
    """The prompts for one request mode ('plain', 'stream' or 'first')."""
    return {name: make(f"{mode}-{name}", words) for name, words in LENGTHS.items()}
