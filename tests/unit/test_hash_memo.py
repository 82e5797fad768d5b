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


def test_with_known_blocks_it_hashes_up_to_the_first_unknown_one_only():
    """A router needs a prompt's hashes only as far as some replica holds them: with `known`,
    the memo returns `hash_blocks`'s leading values up to the first unknown hash (included; more
    only where it had them already), and a later turn carries on from what it kept."""
    rng = random.Random(4)
    for trial in range(300):
        memo = HashMemo(BS)
        system = _ids(rng, rng.randint(0, 40))
        turns = [system + _ids(rng, rng.randint(0, 600))]
        for _ in range(3):
            turns.append(turns[-1] + _ids(rng, rng.randint(0, 300)) if rng.random() < 0.8
                         else system + _ids(rng, rng.randint(0, 500)))
        for t, ids in enumerate(turns):
            full = hash_blocks(ids, BS, "t")
            cut = rng.randint(0, len(full))
            known = set(full[:cut]) | {rng.getrandbits(64)}
            reused = memo.reused_blocks
            got = memo.hashes(ids, "t", rng.choice(["s", None]), known=known)
            assert got == full[:len(got)], (trial, t)
            k = memo.reused_blocks - reused  # past the reused blocks, hashing stops at the first unknown one
            assert len(got) == min(len(full), max(cut, k) + 1), (trial, t)
        everything = memo.hashes(turns[-1], "t", "s")
        assert everything == hash_blocks(turns[-1], BS, "t")


def test_a_new_sessions_uncached_tail_is_neither_packed_nor_hashed():
    rng = random.Random(5)
    memo = HashMemo(BS)
    system = _ids(rng, 64)
    held = set(memo.hashes(system + _ids(rng, 3), "t", "s0"))  # the tenant's system prompt, held
    before = memo.hashed_blocks
    first = memo.hashes(system + _ids(rng, 4000), "t", "s1", known=held)
    assert len(first) == 17 and memo.hashed_blocks - before == 1  # 16 reused, the first new one hashed
    assert len(memo._entries[("t", "s1")][0]) == len(memo._entries[("t",)][0]) == 8 * 17 * BS
