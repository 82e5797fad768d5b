"""The front's memo of block hashes gives exactly `hash_blocks`'s values, hashing only what is new."""

from __future__ import annotations

import random

import pytest

from routing.prefix.block_hash import hash_blocks
from routing.prefix.hash_memo import HashMemo

BS = 4


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1 << 17) for _ in range(n)]


def test_a_sessions_next_turn_hashes_only_what_it_adds():
    rng = random.Random(0)
    memo = HashMemo(BS)
    turn1 = _ids(rng, 41)  # 10 full blocks and a partial one
    assert memo.hashes(turn1, "t", "s1") == hash_blocks(turn1, BS, "t")
    turn2 = turn1 + _ids(rng, 30)
    before = memo.hashed_blocks
    assert memo.hashes(turn2, "t", "s1") == hash_blocks(turn2, BS, "t")
    assert memo.hashed_blocks - before == len(turn2) // BS - 10  # the partial block's tokens are new too


def test_a_prompt_that_diverges_reuses_only_the_blocks_before_it():
    rng = random.Random(1)
    memo = HashMemo(BS)
    system = _ids(rng, 20)
    a = system + _ids(rng, 37)
    memo.hashes(a, "t", "s1")
    b = system + _ids(rng, 33)  # a new session of the same tenant: only the system prompt is shared
    reused = memo.reused_blocks
    assert memo.hashes(b, "t", "s2") == hash_blocks(b, BS, "t")
    assert memo.reused_blocks - reused == 5
    edited = list(a)
    edited[9] += 1  # a changed token in block 2: blocks 0-1 reused, none after
    reused = memo.reused_blocks
    assert memo.hashes(edited, "t", "s1") == hash_blocks(edited, BS, "t")
    assert memo.reused_blocks - reused == 2


def test_another_tenant_never_reuses_a_tenants_hashes():
    rng = random.Random(2)
    memo = HashMemo(BS)
    ids = _ids(rng, 40)
    memo.hashes(ids, "a", "s")
    assert memo.hashes(ids, "b", "s") == hash_blocks(ids, BS, "b") != hash_blocks(ids, BS, "a")


def test_the_memo_keeps_at_most_its_token_budget():
    rng = random.Random(3)
    memo = HashMemo(BS, max_tokens=100)
    for i in range(20):
        ids = _ids(rng, 40)
        assert memo.hashes(ids, "t", f"s{i}") == hash_blocks(ids, BS, "t")
        assert memo._bytes <= 8 * 100
    huge = _ids(rng, 400)  # larger than the budget: hashed, not kept
    assert memo.hashes(huge, "t", "big") == hash_blocks(huge, BS, "t")
    assert memo._bytes <= 8 * 100
    with pytest.raises(ValueError):
        HashMemo(0)
