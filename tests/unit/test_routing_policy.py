import random

import pytest

from routing.policy.contracts import ReplicaLoad, RoutingRequest
from routing.policy.policy import BatonPolicy, PolicyConfig
from routing.prefix.prefix_index import PrefixIndex
from routing.prefix.session_pins import SessionPins

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
    # r1 saves 2 more blocks but has 200 more blocks of work queued. At the default 0.1 s a
    # block, a computed block weighs 32 (recompute_weight) plus 32 for the block it evicts
    # (no KV free): r1 1 * 6.4 + 40 s = 46.4, r2 3 * 6.4 + 20 s = 39.2. r2 wins on load.
    d = policy.route(RoutingRequest(REQ), loads(r0=500, r1=400, r2=200, r3=500), idx, pins, now=0)
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


def test_session_pin_is_honoured_over_a_slightly_shorter_queue():
    idx, pins, policy = setup()
    pins.pin("s", "r1", now=0)
    d = policy.route(RoutingRequest(REQ, session="s"), loads(r0=5, r1=30, r2=5, r3=5), idx, pins, now=1)
    assert (d.replica, d.reason, d.cached_blocks, d.repinned) == ("r1", "pinned", 4, False)
    assert d.predicted_s == d.stay_s == pytest.approx(3.0 + 0.1)  # 30 blocks queued, 1 to compute


def test_pin_survives_another_replica_being_overloaded():
    idx, pins, policy = setup()
    pins.pin("s", "r1", now=0)
    d = policy.route(RoutingRequest(REQ, session="s"), loads(r0=10, r1=10, r2=5000, r3=10), idx, pins, now=1)
    assert (d.replica, d.reason) == ("r1", "pinned")


def test_first_request_of_a_session_pins_it():
    idx, pins, policy = setup()
    d = policy.route(RoutingRequest(REQ, session="s"), loads(r0=10, r1=10, r2=10, r3=10), idx, pins, now=0)
    assert (d.replica, d.reason, d.repinned) == ("r1", "prefix", False)
    assert pins.get("s", now=1) == "r1"


def test_overloaded_pin_moves_to_next_best_and_repins():
    idx, pins, policy = setup()
    pins.pin("s", "r1", now=0)
    d = policy.route(RoutingRequest(REQ, session="s"), loads(r0=10, r1=1070, r2=10, r3=10), idx, pins, now=1)
    assert (d.replica, d.reason, d.cached_blocks, d.repinned) == ("r2", "moved", 2, True)
    assert pins.get("s", now=2) == "r2" and pins.repins == 1
    assert d.stay_s == pytest.approx(107.1) and d.predicted_s == pytest.approx(1.3)


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


@pytest.mark.parametrize("system", [(SYSTEM,), tuple(range(SYSTEM, SYSTEM + 40))])
def test_high_fanout_head_is_not_a_reason_to_stick(system):
    # Only r0 holds the system prompt (one block, or forty: one child each but the last), but eight
    # conversations branch from it: it is a shared head, so a new conversation is routed by load.
    idx = PrefixIndex()
    for conv in range(8):
        idx.apply_stored("r0", [*system, 500 + conv])
    policy, pins = BatonPolicy(rng=random.Random(0)), SessionPins()
    d = policy.route(RoutingRequest((*system, 9)), loads(r0=5, r1=1), idx, pins, now=0)
    assert (d.replica, d.reason, d.cached_blocks) == ("r1", "load", 0)
    # A conversation's own block still pulls it back to r0.
    d = policy.route(RoutingRequest((*system, 503, 7)), loads(r0=5, r1=1), idx, pins, now=0)
    assert (d.replica, d.reason, d.cached_blocks) == ("r0", "prefix", len(system) + 1)
    # Seven conversations are not many: the prompt's holder still draws the eighth.
    idx = PrefixIndex()
    for conv in range(7):
        idx.apply_stored("r0", [*system, 500 + conv])
    d = policy.route(RoutingRequest((*system, 9)), loads(r0=5, r1=1), idx, pins, now=0)
    assert (d.replica, d.reason) == ("r0", "prefix")


@pytest.mark.parametrize("wait_a, expected", [(8.0, ("a", "pinned")), (30.0, ("b", "moved"))])
def test_a_queue_much_longer_than_a_peers_breaks_the_pin(wait_a, expected):
    # Same request counts; a's engine has left a request unscheduled for `wait_a` s, b's none.
    # Moving recomputes 2 more blocks (each 0.1 s, weighed 32 and 32 more for what it evicts):
    # 12.8 s more than staying, so 8 s of queue keeps the pin and 30 s moves it.
    idx, pins = PrefixIndex(), SessionPins()
    idx.apply_stored("a", [1, 2])
    pins.pin("s", "a", now=0)
    lds = {"a": ReplicaLoad(running=2, queued=2, oldest_wait_s=wait_a), "b": ReplicaLoad(running=2, queued=2)}
    d = BatonPolicy(rng=random.Random(0)).route(RoutingRequest((1, 2, 3), "s"), lds, idx, pins, now=1)
    assert (d.replica, d.reason) == expected


def test_a_new_session_goes_where_fewest_sessions_are_pinned_then_least_loaded_ties_in_turn():
    """With a placement ticket, a new session takes the replica with the fewest live sessions,
    however busy; among equals the least loaded in flight; among those the ticket takes turns,
    whatever the RNG draws."""
    policy, pins = BatonPolicy(rng=random.Random(0)), SessionPins()

    def lds(a: int, b: int, c: int, busy_b: int = 2) -> dict[str, ReplicaLoad]:
        return {n: ReplicaLoad(running=r, sessions=s) for n, r, s in (("a", 0, a), ("b", busy_b, b), ("c", 0, c))}

    d = policy.route(RoutingRequest((1, 2), "new"), lds(3, 1, 2), PrefixIndex(), pins, now=0, placement=7)
    assert (d.replica, d.reason) == ("b", "load")  # fewest sessions, though the busiest (within the overload bound)
    picks = [policy.route(RoutingRequest((1, 2), f"s{t}"), lds(2, 2, 2), PrefixIndex(), pins, now=0,
                          placement=t).replica for t in range(4)]
    assert picks == ["a", "c", "a", "c"]  # equal sessions: never beside b's two requests in flight
    picks = [policy.route(RoutingRequest((1, 2), f"e{t}"), lds(2, 2, 2, busy_b=0), PrefixIndex(), pins, now=0,
                          placement=t).replica for t in range(6)]
    assert picks == ["a", "b", "c", "a", "b", "c"]
    # Without a session or a ticket, the load draw as before: never the busy b.
    assert {policy.route(RoutingRequest((1, 2)), lds(3, 0, 3), PrefixIndex(), pins, now=0, placement=1).replica
            for _ in range(10)} <= {"a", "c"}


def test_a_live_pin_and_a_specific_prefix_outrank_session_counts():
    idx, pins, policy = PrefixIndex(), SessionPins(), BatonPolicy(rng=random.Random(0))
    idx.apply_stored("a", [1, 2, 3])
    lds = {"a": ReplicaLoad(running=1, sessions=9), "b": ReplicaLoad(running=1, sessions=0)}
    d = policy.route(RoutingRequest((1, 2, 3, 4), "fork"), lds, idx, pins, now=0, placement=0)
    assert (d.replica, d.reason) == ("a", "prefix")  # its context is there: sessions do not move it
    pins.pin("old", "a", now=0)
    d = policy.route(RoutingRequest((5, 6), "old"), lds, idx, pins, now=1, placement=0)
    assert (d.replica, d.reason) == ("a", "pinned")


@pytest.mark.parametrize("store, a, b, expected", [
    (None, 20, 0, ("a", "pinned")),  # no shared tier: 2 s of queue is less than recomputing 3 blocks
    (3, 1, 1, ("a", "pinned")),  # the tier holds it, but a's queue is no longer
    (3, 20, 0, ("b", "moved")),  # 2 s queued on a: moving costs three pool loads (15 ms)
    (2, 20, 0, ("a", "pinned")),  # the tier lacks a block a holds: moving would recompute it
])
def test_a_pin_yields_to_load_when_the_pool_holds_the_prefix(store, a, b, expected):
    idx, pins = PrefixIndex(), SessionPins()
    idx.apply_stored("a", [1, 2, 3])
    if store is not None:
        idx.apply_stored("pool", [1, 2, 3][:store])
    pins.pin("s", "a", now=0)
    policy = BatonPolicy(PolicyConfig(shared_tier="pool"), rng=random.Random(0))
    lds = {"a": ReplicaLoad(running=1, queued_prefill_blocks=a, free_kv_blocks=10),
           "b": ReplicaLoad(running=1, queued_prefill_blocks=b, free_kv_blocks=10)}
    d = policy.route(RoutingRequest((1, 2, 3, 4), "s"), lds, idx, pins, now=1)
    assert (d.replica, d.reason, d.repinned) == (*expected, expected[0] == "b")
    assert pins.get("s", now=2) == expected[0]
