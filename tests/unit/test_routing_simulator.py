import random

import pytest

from routing.policy.baselines import GreedyCapped, LeastLoaded, RoundRobin, TextPrefixTree
from routing.policy.baton_router import BatonRouter
from routing.policy.contracts import ReplicaLoad, RoutingRequest
from routing.sim.simulator import PoolEvent, ServiceModel, simulate, single_cache_hit_ratio
from routing.sim.trace import TraceRequest, conversation_session

# Two conversations sharing block 1 and 2, one request with nothing shared.
TRACE = [
    TraceRequest(0.0, 3 * 512, 512, (1, 2, 3)),
    TraceRequest(1.0, 3 * 512, 0, (1, 2, 4)),
    TraceRequest(2.0, 4 * 512, 0, (1, 2, 3, 5)),
    TraceRequest(3.0, 1 * 512, 0, (9,)),
]


def test_round_robin_hit_ratio_and_imbalance_are_exact():
    res = simulate(TRACE, RoundRobin(), replicas=2, capacity=10)
    assert res.hit_ratio == pytest.approx(3 / 11)  # only request 2 hits, 3 blocks
    assert res.requests == {"r0": 2, "r1": 2}
    # Work: r0 = 3 + 1 (512 output tokens) + 1 uncached; r1 = 3 + 1.
    assert res.work == {"r0": 5.0, "r1": 4.0}
    assert res.imbalance == pytest.approx(5 / 4.5)


def test_baton_follows_the_prefix():
    router = BatonRouter(rng=random.Random(0))
    res = simulate(TRACE, router, replicas=2, capacity=10)
    assert res.hit_ratio == pytest.approx(5 / 11)  # 2 + 3 blocks hit
    assert sorted(res.requests.values()) == [1, 3]
    assert res.reasons == {"load": 2, "prefix": 2}
    assert len(res.latencies_us) == 4


def test_kv_events_keep_the_index_equal_to_the_caches():
    trace = [TraceRequest(float(i), 512, 10, tuple(range(10 * i, 10 * i + 6))) for i in range(12)]
    router = BatonRouter(rng=random.Random(0))
    res = simulate(trace, router, replicas=3, capacity=8)
    assert res.held_blocks == {r: router.index.num_blocks(r) for r in ("r0", "r1", "r2")}
    assert all(n <= 8 for n in res.held_blocks.values())


def test_reference_bounds():
    assert single_cache_hit_ratio(TRACE, None) == pytest.approx(5 / 11)
    assert single_cache_hit_ratio(TRACE, 2) == pytest.approx(4 / 11)


def test_every_baseline_runs():
    for router in (RoundRobin(), LeastLoaded(), GreedyCapped(), TextPrefixTree(10, random.Random(0))):
        res = simulate(TRACE, router, replicas=2, capacity=10)
        assert 0.0 <= res.hit_ratio <= 5 / 11


def test_replica_death_and_addition():
    trace = [TraceRequest(i * 0.5, 512, 0, (0, 1000 + i, 2000 + i)) for i in range(40)]
    events = [PoolEvent(5.0, "remove", "r0"), PoolEvent(5.0, "add", "r9")]
    router = BatonRouter(rng=random.Random(0))
    seen = []

    class Spy(BatonRouter):
        def on_routed(self, request, replica, now):
            seen.append((now, replica))

    router = Spy(rng=random.Random(0))
    res = simulate(trace, router, replicas=2, capacity=50, pool_events=events)
    assert all(r != "r0" for t, r in seen if t >= 5.0)
    assert any(r == "r9" for t, r in seen if t >= 5.0)  # the new replica warms up
    assert "r0" not in router.index.replicas()
    assert res.held_blocks["r0"] == 0


def test_service_model_reports_queued_and_running():
    from routing.sim.simulator import SimReplica

    rep = SimReplica("r", capacity=100, model=ServiceModel(prefill_blocks_per_s=10, decode_tokens_per_s=10))
    rep.serve(TraceRequest(0.0, 0, 10, tuple(range(20))), now=0.0)  # prefill 0..2 s, decode 2..3 s
    rep.serve(TraceRequest(0.0, 0, 0, tuple(range(100, 110))), now=0.0)  # queued until 2 s
    load = rep.load(1.0)
    assert (load.running, load.queued) == (1, 1)
    assert load.pending_blocks == pytest.approx(20 + 10 / 512)  # 2 s of prefill left + decode
    assert rep.load(3.5).running == 0


def test_conversation_session_uses_the_first_specific_block():
    assert conversation_session(TRACE[0]) == conversation_session(TRACE[2])
    assert conversation_session(TRACE[3]) is None


def test_stored_events_are_split_into_contiguous_runs():
    from routing.sim.simulator import _contiguous_runs

    assert _contiguous_runs([1, 2, 3, 4, 5], [2, 3, 5]) == [(1, [2, 3]), (4, [5])]
    assert _contiguous_runs([1, 2], [1, 2]) == [(None, [1, 2])]
    assert _contiguous_runs([1, 2], []) == []


def test_the_router_places_a_new_session_by_its_ticket_and_keeps_a_pinned_one():
    """`BatonRouter.route` passes a new session's placement ticket to the policy, as a front does
    (bench/scale/scale_agentic.py places its sessions this way): fewest live sessions first,
    ties in turn; a pinned session's later turn stays where it is."""
    router = BatonRouter(rng=random.Random(0))
    loads = {n: ReplicaLoad(running=0, capacity=100, free_kv_blocks=100, sessions=s)
             for n, s in (("a", 3), ("b", 1), ("c", 1))}
    picks = [router.route(RoutingRequest((1, 2), f"s{t}"), loads, now=0.0, placement=t).replica for t in range(4)]
    assert picks == ["b", "c", "b", "c"]
    assert router.route(RoutingRequest((1, 2, 3), "s0"), loads, now=1.0).replica == "b"
