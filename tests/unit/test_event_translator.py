"""Engine KV events become the same tenant-salted hashes the router computes."""

from __future__ import annotations

import random

from routing.prefix.block_hash import hash_blocks
from routing.prefix.event_translator import EventTranslator, chains, salt_of

BS = 4
TOKENS = list(range(100, 112))  # three full blocks


def test_stored_events_hash_like_the_router_across_chained_events():
    t = EventTranslator(BS)
    first = t.stored("r1", ["e1", "e2"], None, TOKENS[:8], [("tenant-a",), None])
    second = t.stored("r1", ["e3"], "e2", TOKENS[8:12], [None])
    expected = hash_blocks(TOKENS, BS, "tenant-a")
    assert first.hashes == expected[:2] and first.parent is None
    assert second.hashes == expected[2:] and second.parent == expected[1]


def test_salt_separates_tenants_and_unsalted_prompts():
    t = EventTranslator(BS)
    a = t.stored("r1", ["a1"], None, TOKENS[:4], [("tenant-a",)]).hashes
    b = t.stored("r2", ["b1"], None, TOKENS[:4], [("tenant-b",)]).hashes
    plain = t.stored("r3", ["p1"], None, TOKENS[:4], None).hashes
    assert len({a[0], b[0], plain[0]}) == 3
    assert plain == hash_blocks(TOKENS[:4], BS, None)


def test_unknown_parent_or_short_tokens_is_dropped():
    t = EventTranslator(BS)
    assert t.stored("r1", ["x"], "never-seen", TOKENS[:4], None) is None
    assert t.stored("r1", ["x", "y"], None, TOKENS[:5], None) is None


def test_removed_and_store_events_use_the_replicas_map():
    t = EventTranslator(BS)
    h = t.stored("p", ["e1", "e2"], None, TOKENS[:8], [("s",), None]).hashes
    assert t.known("p", ["e2", "zz"]) == [h[1]]
    assert t.known("other", ["e1"]) == []
    assert t.removed("p", ["e1", "zz"]) == [h[0]]
    assert t.removed("p", ["e1"]) == []
    t.cleared("p")
    assert t.known("p", ["e2"]) == []


def test_salt_of_picks_the_string_key():
    assert salt_of(None) is None
    # Baton serves no LoRA adapters; with one, its name would come first.
    assert salt_of(("lora-x", ("mm", 3), "tenant")) == "lora-x"
    assert salt_of((("mm", 3), "tenant")) == "tenant"


def test_store_holdings_outlive_the_engines_copy_until_the_store_reports_them_gone():
    t = EventTranslator(BS)
    h = t.stored("p1", ["e1", "e2"], None, TOKENS[:8], [("s",), None]).hashes
    assert t.store_stored("p1", ["e1", "e2", "unknown"]) == h
    assert t.removed("p1", ["e1", "e2"]) == h  # the engine evicts its own copy
    assert t.store_removed(["e2", "zz"]) == [h[1]]  # the store lost one block
    assert t.store_removed(["e2"]) == []
    assert t.store_forget("p1") == [h[0]]  # nobody is left to report e1's eviction


def test_store_holdings_stay_while_another_replica_vouches_for_them():
    t = EventTranslator(BS)
    h = t.stored("p1", ["e1"], None, TOKENS[:4], None).hashes
    t.stored("p2", ["e1"], None, TOKENS[:4], None)
    assert t.store_stored("p1", ["e1"]) == h and t.store_stored("p2", ["e1"]) == h
    assert t.store_forget("p1") == []
    assert t.store_forget("p2") == h


def test_a_replica_that_left_gives_its_store_bit_to_the_next_and_the_journal_names_them():
    journal: list = []
    t = EventTranslator(BS, journal=journal)
    h = t.stored("p1", ["e1"], None, TOKENS[:4], None).hashes
    for r in ("p2", "p3"):
        t.stored(r, ["e1"], None, TOKENS[:4], None)
    t.store_stored("p1", ["e1"])
    t.store_stored("p2", ["e1"])
    assert t.store_forget("p1") == []  # p2 still vouches
    t.store_stored("p3", ["e1"])  # takes p1's bit
    assert journal[-1] == ("store_set", {"e1": (h[0], ["p2", "p3"])})
    t.rejournal("p3")
    assert journal[-1] == ("store_set", {"e1": (h[0], ["p2", "p3"])})
    assert t.store_forget("p2") == [] and t.store_forget("p3") == h


def test_the_maps_give_the_cyclic_collector_nothing_per_block():
    """A tuple or set per block made each map one Python's collector traverses again after every
    change (at 64 engines' full KV, 269 ms a full collection of the indexer's process): ints and
    strings in dicts, which it does not track."""
    import gc

    t = EventTranslator(BS)
    rng = random.Random(3)
    for r in ("p1", "p2"):
        for k in range(200):
            engine = [rng.getrandbits(60) for _ in range(3)]
            t.stored(r, engine, None, TOKENS, [("tenant",), None, None])
            t.store_stored(r, engine[:2])
    gc.collect()
    maps = [d for m in t._maps.values() for d in (m.baton, m.salt, m.parent)]
    assert len(t._store) == 800 and not any(gc.is_tracked(d) for d in maps + [t._store, t._saved_by])


def _replayed(journal: list) -> tuple[dict, dict]:
    """The maps a journal leaves behind, applied as deployments/kv_index/indexer_state.py writes them."""
    maps: dict = {}
    store: dict = {}
    for op in journal:
        if op[0] == "set":
            maps.setdefault(op[1], {}).update(op[2])
        elif op[0] == "del":
            for h in op[2]:
                maps.get(op[1], {}).pop(h, None)
        elif op[0] == "clear":
            maps.pop(op[1], None)
        elif op[0] == "store_set":
            store.update(op[1])
        elif op[0] == "store_del":
            for h in op[1]:
                store.pop(h, None)
    return maps, store


def test_the_journal_rebuilds_a_translator_that_translates_the_same():
    journal: list = []
    t = EventTranslator(BS, journal=journal)
    t.stored("r1", ["e1", "e2"], None, TOKENS[:8], [("tenant-a",), None])
    t.stored("r2", ["f1"], None, TOKENS[:4], [("tenant-a",)])
    t.store_stored("r1", ["e1", "e2"])
    t.store_stored("r2", ["f1"])
    t.removed("r1", ["e1", "e1"])  # a repeated hash is removed once
    t.store_forget("r2")
    t.cleared("r2")
    maps, store = _replayed(journal)
    assert set(maps) == {"r1"} and set(maps["r1"]) == {"e2"} and set(store) == {"e1", "e2"}
    resumed = EventTranslator(BS)
    for replica, entries in maps.items():
        resumed.restore(replica, entries)
    resumed.restore_store(store)
    later = resumed.stored("r1", ["e3"], "e2", TOKENS[8:12], [None])  # chains on a restored parent
    assert later.hashes == hash_blocks(TOKENS, BS, "tenant-a")[2:]
    assert resumed.store_removed(["e1"]) == t.store_removed(["e1"])
    assert resumed.replicas() == ["r1"]


def test_chains_cover_a_tree_once_each_with_its_links():
    rng = random.Random(5)
    for _ in range(200):
        n = rng.randint(1, 40)
        parents = {h: (rng.choice([None, *range(1, h)]) if h > 1 else None) for h in range(1, n + 1)}
        held = {h for h in parents if rng.random() < 0.7}
        out = chains(held, parents)
        flat = [h for _, chain in out for h in chain]
        assert sorted(flat) == sorted(held)  # each block once
        for parent, chain in out:  # every link is the block's own parent
            assert [parent, *chain[:-1]] == [parents[h] for h in chain]
    # a path is one call; a fork starts a second chain at the branch
    assert chains({1, 2, 3}, {1: None, 2: 1, 3: 2}) == [(None, [1, 2, 3])]
    assert chains({1, 2, 3}, {1: None, 2: 1, 3: 1}) == [(None, [1, 2]), (1, [3])]
    assert chains({7}, {}) == [(None, [7])]
