import random

import pytest

from routing.contracts import ReplicaLoad, RoutingRequest
from routing.policy import BatonPolicy, PolicyConfig
from routing.prefix_index import PrefixIndex
from routing.session_pins import SessionPins

SYSTEM = 100  # block every replica holds, like the trace's shared system prompt


def loads(**pending):
    """ReplicaLoad per replica from its work in flight (blocks); all warm."""
    return {
        n: ReplicaLoad(running=1, queued=0, free_kv_blocks=0, capacity=100, pending_blocks=p)
        for n, p in pending.items()
    }


def setup():
    idx = PrefixIndex()
    for r in ("r0", "r1", "r2", "r3"):
        idx.apply_stored(r, [SYSTEM])
    idx.apply_stored("r1", [1, 2, 3])  # r1 holds SYSTEM,1,2,3
    idx.apply_stored("r2", [1])  # r2 holds SYSTEM,1
    return idx, SessionPins(ttl_s=60), BatonPolicy(rng=random.Random(0))


REQ = (SYSTEM, 1, 2, 3, 4)


def test_longest_specific_prefix_wins():
    idx, pins, policy = setup()
    d = policy.route(RoutingRequest(REQ), loads(r0=10, r1=30, r2=10, r3=10), idx, pins, now=0)
    assert (d.replica, d.reason, d.cached_blocks, d.repinned) == ("r1", "prefix", 4, False)


def test_overloaded_holder_falls_back_to_next_longest():
    idx, pins, policy = setup()
    # mean = 275, bound = 2 * 275 + 200 = 750: only r1 is over it.
    d = policy.route(RoutingRequest(REQ), loads(r0=10, r1=1070, r2=10, r3=10), idx, pins, now=0)
    assert (d.replica, d.reason, d.cached_blocks) == ("r2", "prefix", 2)


def test_large_load_gap_moves_a_short_prefix():
    idx, pins, policy = setup()
    # SYSTEM,1 is held by two of four replicas: popular, credited to all.
    # r1 saves 2 more blocks but has 100 more blocks of work: 0.03 * 100 > 2.
    # Costs: r0 3 + 15, r1 1 + 12, r2 3 + 9, r3 3 + 15. r2 wins on load.
    d = policy.route(RoutingRequest(REQ), loads(r0=500, r1=400, r2=300, r3=500), idx, pins, now=0)
    assert (d.replica, d.reason, d.cached_blocks) == ("r2", "load", 2)


def test_cold_request_goes_by_load():
    idx, pins, policy = setup()
    d = policy.route(RoutingRequest((SYSTEM, 77, 78)), loads(r0=50, r1=50, r2=50, r3=5), idx, pins, now=0)
    # Power of two choices: r3 wins whenever it is drawn; with this seed it is.
    assert d.reason == "load" and d.cached_blocks == 1
    picks = {
        policy.route(RoutingRequest((SYSTEM, 77)), loads(r0=9, r1=9, r2=9, r3=1), idx, pins, 0).replica
        for _ in range(50)
    }
    assert "r3" in picks and picks <= {"r0", "r1", "r2", "r3"}


def test_two_replicas_cold_is_least_loaded():
    policy = BatonPolicy(rng=random.Random(3))
    d = policy.route(RoutingRequest((5, 6)), loads(a=20, b=3), PrefixIndex(), SessionPins(), now=0)
    assert (d.replica, d.reason, d.cached_blocks) == ("b", "load", 0)


def test_new_empty_replica_takes_cold_traffic():
    idx, pins, policy = setup()
    lds = loads(r0=20, r1=20, r2=20, r3=20)
    lds["new"] = ReplicaLoad(running=0, queued=0, free_kv_blocks=100, capacity=100, pending_blocks=0)
    picks = [policy.route(RoutingRequest((SYSTEM, 50 + i)), lds, idx, pins, now=0).replica for i in range(20)]
    assert picks == ["new"] * 20


def test_shared_prefix_alone_does_not_starve_other_replicas():
    # Only r0 holds the system prompt: the first holder must not win every request.
    idx = PrefixIndex()
    idx.apply_stored("r0", [SYSTEM])
    policy, pins = BatonPolicy(rng=random.Random(0)), SessionPins()
    d = policy.route(RoutingRequest((SYSTEM, 9)), loads(r0=0, r1=0), idx, pins, now=0)
    assert d.reason == "prefix" and d.replica == "r0"  # one holder: still specific
    # One block saved does not outweigh 300 blocks of queue (0.03 * 300 = 9).
    d = policy.route(RoutingRequest((SYSTEM, 9)), loads(r0=300, r1=0), idx, pins, now=0)
    assert (d.replica, d.reason, d.cached_blocks) == ("r1", "load", 0)


def test_session_pin_is_honoured_over_a_longer_prefix():
    idx, pins, policy = setup()
    pins.pin("s", "r0", now=0)
    d = policy.route(RoutingRequest(REQ, session="s"), loads(r0=10, r1=10, r2=10, r3=10), idx, pins, now=1)
    assert (d.replica, d.reason, d.cached_blocks, d.repinned) == ("r0", "pinned", 1, False)


def test_pin_survives_another_replica_being_overloaded():
    idx, pins, policy = setup()
    pins.pin("s", "r0", now=0)
    d = policy.route(RoutingRequest(REQ, session="s"), loads(r0=10, r1=10, r2=5000, r3=10), idx, pins, now=1)
    assert (d.replica, d.reason) == ("r0", "pinned")


def test_first_request_of_a_session_pins_it():
    idx, pins, policy = setup()
    d = policy.route(RoutingRequest(REQ, session="s"), loads(r0=10, r1=10, r2=10, r3=10), idx, pins, now=0)
    assert (d.replica, d.reason, d.repinned) == ("r1", "prefix", False)
    assert pins.get("s", now=1) == "r1"


def test_overloaded_pin_moves_to_next_best_and_repins():
    idx, pins, policy = setup()
    pins.pin("s", "r1", now=0)
    d = policy.route(RoutingRequest(REQ, session="s"), loads(r0=10, r1=1070, r2=10, r3=10), idx, pins, now=1)
    assert (d.replica, d.reason, d.cached_blocks, d.repinned) == ("r2", "prefix", 2, True)
    assert pins.get("s", now=2) == "r2" and pins.repins == 1


def test_dead_pin_moves_to_next_best_and_repins():
    idx, pins, policy = setup()
    pins.pin("s", "r1", now=0)
    lds = loads(r0=10, r1=10, r2=10, r3=10)
    lds["r1"] = ReplicaLoad(alive=False)
    d = policy.route(RoutingRequest(REQ, session="s"), lds, idx, pins, now=1)
    assert (d.replica, d.reason, d.cached_blocks, d.repinned) == ("r2", "prefix", 2, True)
    assert pins.get("s", now=2) == "r2"


def test_expired_pin_is_not_a_repin():
    idx, pins, policy = setup()
    pins.pin("s", "r0", now=0)
    d = policy.route(RoutingRequest(REQ, session="s"), loads(r0=10, r1=10, r2=10, r3=10), idx, pins, now=100)
    assert (d.replica, d.reason, d.repinned) == ("r1", "prefix", False)


def test_no_live_replica_raises_and_config_is_validated():
    with pytest.raises(ValueError):
        BatonPolicy().route(RoutingRequest((1,)), {"r0": ReplicaLoad(alive=False)}, PrefixIndex(), SessionPins(), 0)
    with pytest.raises(ValueError):
        PolicyConfig(overload_ratio=0.5)


def test_falls_back_to_request_counts_without_pending_blocks():
    policy = BatonPolicy(rng=random.Random(0))
    lds = {"a": ReplicaLoad(running=8, queued=4), "b": ReplicaLoad(running=1, queued=0)}
    d = policy.route(RoutingRequest((1, 2)), lds, PrefixIndex(), SessionPins(), now=0)
    assert (d.replica, d.reason) == ("b", "load")


def test_high_fanout_head_is_not_a_reason_to_stick():
    # Only r0 holds the system prompt, but eight conversations branch from it:
    # it is a shared head, so a new conversation is routed by load.
    idx = PrefixIndex()
    for conv in range(8):
        idx.apply_stored("r0", [SYSTEM, 500 + conv])
    policy, pins = BatonPolicy(rng=random.Random(0)), SessionPins()
    d = policy.route(RoutingRequest((SYSTEM, 9)), loads(r0=5, r1=1), idx, pins, now=0)
    assert (d.replica, d.reason, d.cached_blocks) == ("r1", "load", 0)
    # A conversation's own block still pulls it back to r0.
    d = policy.route(RoutingRequest((SYSTEM, 503, 7)), loads(r0=5, r1=1), idx, pins, now=0)
    assert (d.replica, d.reason, d.cached_blocks) == ("r0", "prefix", 2)


@pytest.mark.parametrize("wait_a, expected", [(4.0, ("a", "pinned")), (8.0, ("b", "load"))])
def test_a_queue_much_longer_than_a_peers_breaks_the_pin(wait_a, expected):
    # Same request counts; a's engine has left a request unscheduled for `wait_a` s, b's none.
    idx, pins = PrefixIndex(), SessionPins()
    idx.apply_stored("a", [1, 2])
    pins.pin("s", "a", now=0)
    lds = {"a": ReplicaLoad(running=2, queued=2, oldest_wait_s=wait_a), "b": ReplicaLoad(running=2, queued=2)}
    d = BatonPolicy(rng=random.Random(0)).route(RoutingRequest((1, 2, 3), "s"), lds, idx, pins, now=1)
    assert (d.replica, d.reason) == expected
