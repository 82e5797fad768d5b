"""The indexer's journal, coalesced per flush, leaves Redis as the ops one by one would (pure)."""

from __future__ import annotations

import random

from deployments.kv_index.indexer_state import STORE_KEY, _enc, coalesce, map_key


def _one_by_one(state: dict, ops: list) -> dict:
    """Redis's hashes after each op's own command, in order (what `queue` sent before coalescing)."""
    out = {k: dict(v) for k, v in state.items()}
    for op in ops:
        kind = op[0]
        if kind == "clear":
            out.pop(map_key(op[1]), None)
            continue
        key, changes = (STORE_KEY, op[1]) if kind.startswith("store_") else (map_key(op[1]), op[2])
        if kind.endswith("set"):
            out.setdefault(key, {}).update({_enc.encode(h): _enc.encode(v) for h, v in changes.items()})
        else:
            for h in changes:
                out.get(key, {}).pop(_enc.encode(h), None)
    return {k: v for k, v in out.items() if v}


def _coalesced(state: dict, ops: list) -> tuple[dict, int]:
    out = {k: dict(v) for k, v in state.items()}
    commands = 0
    for key, (cleared, sets, dels) in coalesce(ops).items():
        if cleared:
            out.pop(key, None)
        for f in dels:
            out.get(key, {}).pop(f, None)
        out.setdefault(key, {}).update(sets)
        commands += cleared + bool(dels) + bool(sets)
    return {k: v for k, v in out.items() if v}, commands


def _random_ops(rng: random.Random, n: int) -> list:
    replicas, hashes = ["r1", "r2", "r3"], list(range(12))
    ops = []
    for _ in range(n):
        kind = rng.choice(["set", "set", "del", "del", "clear", "store_set", "store_del"])
        some = rng.sample(hashes, rng.randint(1, 4))
        if kind == "set":
            ops.append(("set", rng.choice(replicas), {h: (rng.randint(0, 99), "t", None) for h in some}))
        elif kind == "del":
            ops.append(("del", rng.choice(replicas), some))
        elif kind == "clear":
            ops.append(("clear", rng.choice(replicas)))
        elif kind == "store_set":
            ops.append(("store_set", {h: (rng.randint(0, 99), ["r1"]) for h in some}))
        else:
            ops.append(("store_del", some))
    return ops


def test_coalesced_journal_writes_what_the_ops_one_by_one_write():
    rng = random.Random(7)
    for _ in range(500):
        before = _one_by_one({}, _random_ops(rng, rng.randint(0, 10)))  # what Redis held already
        ops = _random_ops(rng, rng.randint(0, 40))
        after, commands = _coalesced(before, ops)
        assert after == _one_by_one(before, ops)
        assert commands <= 3 * 4  # at most a DEL, an HDEL and an HSET for each of 4 keys


def test_a_set_then_removed_field_is_only_removed_and_a_clear_drops_what_came_before():
    ops = [("set", "r1", {1: (10, None, None)}), ("del", "r1", [1]),
           ("set", "r2", {2: (20, None, None)}), ("clear", "r2"), ("set", "r2", {3: (30, None, None)})]
    out = coalesce(ops)
    assert out[map_key("r1")] == (False, {}, [_enc.encode(1)])
    assert out[map_key("r2")] == (True, {_enc.encode(3): _enc.encode((30, None, None))}, [])
