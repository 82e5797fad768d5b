"""One contract, two backends: the in-process PrefixIndex and RedisIndex on a real Redis."""

from __future__ import annotations

import pytest
import redis

from routing.prefix.block_hash import hash_blocks
from routing.prefix.index_api import FANOUT_CAP, KVIndex
from routing.prefix.prefix_index import PrefixIndex
from routing.prefix.redis_index import RedisIndex


@pytest.fixture(params=["memory", "redis"])
def index(request) -> KVIndex:
    if request.param == "memory":
        return PrefixIndex()
    client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    client.flushdb()
    return RedisIndex(client)


def test_leading_runs_per_replica(index):
    index.apply_stored("a", [1, 2, 3])
    index.apply_stored("b", [1, 2])
    index.apply_stored("c", [2, 3])  # holds no first block: never matches
    assert index.match([1, 2, 3, 4]) == {"a": 3, "b": 2}
    assert index.match([9, 1]) == {}
    assert index.match([]) == {}
    assert sorted(index.replicas()) == ["a", "b", "c"]
    assert index.num_blocks("a") == 3 and index.num_blocks("nobody") == 0


def test_removal_cuts_the_run_and_unknown_hashes_are_ignored(index):
    index.apply_stored("a", [1, 2, 3])
    index.apply_removed("a", [2, 77])
    index.apply_removed("ghost", [1])
    assert index.match([1, 2, 3]) == {"a": 1}
    assert index.num_blocks("a") == 2


def test_removing_a_block_the_replica_never_held_changes_nothing(index):
    index.apply_stored("a", [5], parent=40)  # nobody holds 40; its fan-out is 1
    index.apply_stored("b", [6], parent=40)
    index.apply_removed("a", [40])
    index.apply_removed("ghost", [40, 5])
    assert [index.fanout(40), index.fanout(5)] == [2, 0]
    assert index.match([5]) == {"a": 1} and index.match([6]) == {"b": 1}
    index.apply_removed("a", [5])  # held, and nobody else holds it
    assert index.match([5]) == {} and index.fanout(40) == 2


def test_cleared_and_removed_replicas_hold_nothing(index):
    index.apply_stored("a", [1, 2])
    index.apply_stored("b", [1])
    index.apply_cleared("a")
    assert index.match([1, 2]) == {"b": 1}
    assert index.replicas() == ["b"] and index.num_blocks("a") == 0
    index.remove_replica("b")
    index.remove_replica("never-seen")
    assert index.match([1]) == {} and index.replicas() == []
    index.apply_stored("a", [1, 2])  # a cleared replica stores again
    assert index.match([1, 2]) == {"a": 2} and index.num_blocks("a") == 2


def test_fanout_counts_distinct_children_up_to_the_cap_and_goes_with_the_block(index):
    index.apply_stored("a", [10, 11])
    index.apply_stored("b", [12], parent=10)
    index.apply_stored("b", [12], parent=10)  # the same child again
    assert index.fanout(10) == 2 and index.fanout(11) == 0
    index.apply_removed("b", [12])  # an evicted child stays counted
    assert index.fanout(10) == 2
    for child in range(100, 100 + FANOUT_CAP + 5):
        index.apply_stored("c", [child], parent=1)
    assert index.fanout(1) == FANOUT_CAP
    index.apply_removed("a", [10])  # b does not hold 10: nobody does now
    assert index.fanout(10) == 0


def test_snapshot_answers_as_the_index_does(index):
    index.apply_stored("a", [1, 2, 3])
    index.apply_stored("b", [1, 2, 9], None)
    index.apply_stored("c", [5], parent=2)
    query = [1, 2, 9, 4]
    snap = index.snapshot(query)
    assert snap.match(query) == index.match(query) == {"a": 2, "b": 3}
    assert [snap.fanout(h) for h in query] == [index.fanout(h) for h in query] == [1, 3, 0, 0]


def test_tenant_salted_chains_do_not_meet(index):
    tokens = list(range(64))
    a, b = hash_blocks(tokens, 16, "tenant-a"), hash_blocks(tokens, 16, "tenant-b")
    index.apply_stored("r1", a)
    assert index.match(a) == {"r1": 4} and index.match(b) == {}
