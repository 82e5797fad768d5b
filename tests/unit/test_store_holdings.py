"""The store audit: what a worker put, checked against what the store still holds."""

from __future__ import annotations

from kvstore.holdings import StoreAudit, event_hash

KEY = "baton-1f2e@model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@"


def test_event_hash_is_what_vllm_publishes_for_the_keys_chunk_hash():
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash  # here: collection stays light

    digest = bytes(range(32))
    key = KEY + digest.hex()
    assert event_hash(key, int_hashes=True) == int.from_bytes(digest, "big") & (2**64 - 1)
    assert event_hash(key, int_hashes=False) == digest
    # vLLM's own conversion, with its default (integer) event hashes.
    assert event_hash(key) == maybe_convert_block_hash(digest)


def test_keys_no_tier_holds_are_reported_once_and_forgotten():
    audit = StoreAudit(batch=10)
    audit.put(["a", "b", "c"])
    held = {"a", "c"}
    assert audit.check(lambda keys: [k in held for k in keys]) == ["b"]
    assert len(audit) == 2
    assert audit.check(lambda keys: [k in held for k in keys]) == []
    held.clear()
    assert sorted(audit.check(lambda keys: [False for _ in keys])) == ["a", "c"]
    assert len(audit) == 0 and audit.gone == 3


def test_a_pass_is_checked_a_slice_at_a_time():
    audit = StoreAudit(batch=2)
    audit.put(["a", "b", "c", "d", "e"])
    asked: list[list[str]] = []

    def presence(keys):
        asked.append(list(keys))
        return [True] * len(keys)

    for _ in range(4):
        audit.check(presence)
    assert asked == [["a", "b"], ["c", "d"], ["e"], ["a", "b"]]


def test_keys_beyond_the_cap_are_reported_gone_since_nobody_checks_them():
    audit = StoreAudit(max_keys=2, batch=10)
    audit.put(["a", "b"])
    audit.put(["a"])  # used again: now the newest
    audit.put(["c"])
    assert audit.check(lambda keys: [True] * len(keys)) == ["b"]
    assert len(audit) == 2


def test_a_key_put_again_while_checked_stays():
    audit = StoreAudit(batch=10)
    audit.put(["a", "b"])

    def presence(keys):
        audit.put(["a"])  # a new put lands while the store answers for the old one
        return [False] * len(keys)

    assert audit.check(presence) == ["b"]
    assert len(audit) == 1
