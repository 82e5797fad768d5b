"""The benchmark peers of the Baton policy inside the front's routing: round robin and least loaded."""

from __future__ import annotations

from common.config import BatonConfig
from deployments.front.metrics import IngressMetrics
from deployments.front.request_routing import RequestRouting, Reads
from routing.policy.contracts import RoutingRequest
from routing.prefix.prefix_index import IndexSnapshot

LIVE = {"decode": {"a": {}, "b": {}, "c": {}}, "prefill": {}}
NOBODY = {"decode": {}, "prefill": {}}  # no front has anything in flight


def _routing(policy: str) -> RequestRouting:
    cfg = BatonConfig.model_validate({"routing": {"policy": policy}})
    return RequestRouting(cfg, redis_client=None, metrics=IngressMetrics())


def _pick(routing: RequestRouting, n: int) -> list[str]:
    state = Reads(IndexSnapshot([], [], []), LIVE, {"decode": None, "prefill": None}, NOBODY)
    return [routing._choose("decode", RoutingRequest(()), state, 0.0).replica for _ in range(n)]


def test_round_robin_takes_turns():
    assert _pick(_routing("round_robin"), 6) == ["a", "b", "c", "a", "b", "c"]


def test_least_loaded_picks_the_fewest_in_flight_and_takes_turns_among_equals():
    routing = _routing("least_loaded")
    routing.inflight["decode"].update({"a": 2, "b": 0, "c": 1})
    assert _pick(routing, 1) == ["b"]
    routing.inflight["decode"].update({"b": 1})  # a=2, b=1, c=1: b and c tie
    assert sorted(_pick(routing, 2)) == ["b", "c"]


def test_load_is_what_the_fronts_have_in_flight_not_the_engines_stale_report():
    """Other fronts filled `a` (their counts in Redis); this front sent nothing anywhere, yet
    least-loaded avoids `a`, and the prefill work they queued there moves Baton's pin off it. An engine's count
    from its last heartbeat (up to routing.heartbeat_s old) is not load: `c` reports 9 that
    have since finished, and is chosen like `b`."""
    live = {"decode": {"a": {"unfinished": 0}, "b": {"unfinished": 0}, "c": {"unfinished": 9}}, "prefill": {}}
    fronts = {"decode": {"a": 9, "c": 0}, "prefill": {}}
    state = Reads(IndexSnapshot([], [], []), live, {"decode": None, "prefill": None}, fronts)
    least = _routing("least_loaded")
    assert {least._choose("decode", RoutingRequest(()), state, 0.0).replica for _ in range(4)} == {"b", "c"}
    baton = _routing("baton")
    work = {"decode": {"a": 90.0}}
    pinned = Reads(IndexSnapshot([], [], []), live, {"decode": "a", "prefill": None}, fronts, work=work)
    d = baton._choose("decode", RoutingRequest((), session="s"), pinned, 0.0)
    assert d.replica != "a" and d.repinned
    # a drains: the pin holds again (a new read of the view is new dicts, shared_view.py)
    drained = Reads(IndexSnapshot([], [], []), live, {"decode": "a", "prefill": None},
                    {"decode": {"a": 1, "c": 0}, "prefill": {}}, work={"decode": {"a": 0.0}})
    assert baton._choose("decode", RoutingRequest((), session="s"), drained, 0.0).replica == "a"


def test_engines_free_kv_blocks_reach_the_policys_cold_draw():
    """A cold prompt draws two replicas plus one whose engine reports more than half its KV
    free, and takes the least loaded of them: with loads a=c=2 and b=0 the draw holds b only
    when b is the cold one, so every choice is b once b reports its KV free."""
    def state(b_free: int) -> Reads:  # a new heartbeat is a new view: new dicts (shared_view.py)
        live = {"decode": {n: {"kv_blocks": 100, "kv_free_blocks": b_free if n == "b" else 10} for n in "abc"},
                "prefill": {}}
        return Reads(IndexSnapshot([], [], []), live, {"decode": None, "prefill": None},
                      {"decode": {"a": 2, "c": 2}, "prefill": {}})
    routing = _routing("baton")
    cold = state(90)
    picks = {routing._choose("decode", RoutingRequest(()), cold, 0.0).replica for _ in range(20)}
    assert picks == {"b"}
    warm = state(10)  # nobody cold: the two-choice draw sometimes misses b
    picks = {routing._choose("decode", RoutingRequest(()), warm, 0.0).replica for _ in range(40)}
    assert picks != {"b"}


def test_engines_that_never_loaded_are_priced_at_the_stores_measured_rate():
    """The decode engines measured 0.1 ms a token loaded from the store; prefill engines whose
    sessions never moved have not loaded anything: their pin yields to a queue at that rate
    (16 tokens a block), not at a guess. The route's predicted waits sum its pools'."""
    from deployments.front.request_routing import Route
    from routing.policy.contracts import RoutingDecision

    live = {"decode": {"d": {"load_s_per_token": 0.0001, "prefill_s_per_token": 0.002}},
            "prefill": {"a": {"prefill_s_per_token": 0.002}, "b": {"prefill_s_per_token": 0.002}}}
    from routing.policy.rates import mean_rate

    assert mean_rate((e for pool in live.values() for e in pool.values()), "load_s_per_token") == 0.0001
    routing = _routing("baton")
    routing.policy.config = type(routing.policy.config)(shared_tier="pool")
    snap = IndexSnapshot([1, 2, 3], [{"a", "pool"}, {"a", "pool"}, {"a", "pool"}], [0, 0, 0])
    state = Reads(snap, live, {"decode": None, "prefill": "a"}, {"decode": {}, "prefill": {}},
                   work={"prefill": {"a": 40.0}})
    d = routing._choose("prefill", RoutingRequest((1, 2, 3, 4), session="s"), state, 0.0)
    assert (d.replica, d.reason) == ("b", "moved")  # 40 blocks queued (1.3 s) against 3 loads (5 ms)
    route = Route("d", "b", False, "pinned", 0)
    RequestRouting._predictions(route, [RoutingDecision("d", "pinned", 3, False, 0.5, 0.5), d])
    assert route.moved == ["prefill"] and route.stay_s == 0.5 + d.stay_s and route.predicted_s < route.stay_s


def test_a_stale_beat_that_shows_the_previous_turn_waiting_does_not_move_the_pin():
    """`a`'s last beat (0.9 s old) still shows the session's previous turn waiting in its scheduler;
    no front has anything in flight there now, so nothing waits: the next turn stays. While a front
    has a request there, the same beat's wait (plus its age) counts, and the pin moves."""
    beat = {"waiting": 1, "oldest_wait_s": 0.1, "ts": 99.1, "prefill_s_per_token": 0.001}
    live = {"decode": {"a": dict(beat), "b": {"ts": 99.9, "prefill_s_per_token": 0.001}}, "prefill": {}}
    baton = _routing("baton")
    idle = Reads(IndexSnapshot([], [], []), live, {"decode": "a", "prefill": None}, NOBODY)
    assert baton._choose("decode", RoutingRequest((), session="s"), idle, 100.0).replica == "a"
    busy = Reads(IndexSnapshot([], [], []), live, {"decode": "a", "prefill": None},
                  {"decode": {"a": 1}, "prefill": {}})
    assert baton._choose("decode", RoutingRequest((), session="s"), busy, 100.0).replica == "b"
