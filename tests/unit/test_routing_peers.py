"""The benchmark peers of the Baton policy inside the front's routing: round robin and least loaded."""

from __future__ import annotations

from common.config import BatonConfig
from deployments.metrics import IngressMetrics
from deployments.request_routing import RequestRouting, _State
from routing.contracts import RoutingRequest
from routing.snapshot import IndexSnapshot

LIVE = {"decode": {"a": {}, "b": {}, "c": {}}, "prefill": {}}
NOBODY = {"decode": {}, "prefill": {}}  # no front has anything in flight


def _routing(policy: str) -> RequestRouting:
    cfg = BatonConfig.model_validate({"routing": {"policy": policy}})
    return RequestRouting(cfg, redis_client=None, metrics=IngressMetrics())


def _pick(routing: RequestRouting, n: int) -> list[str]:
    state = _State(IndexSnapshot([], [], []), LIVE, {"decode": None, "prefill": None}, NOBODY)
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
    state = _State(IndexSnapshot([], [], []), live, {"decode": None, "prefill": None}, fronts)
    least = _routing("least_loaded")
    assert {least._choose("decode", RoutingRequest(()), state, 0.0).replica for _ in range(4)} == {"b", "c"}
    baton = _routing("baton")
    work = {"decode": {"a": 90.0}}
    pinned = _State(IndexSnapshot([], [], []), live, {"decode": "a", "prefill": None}, fronts, work=work)
    d = baton._choose("decode", RoutingRequest((), session="s"), pinned, 0.0)
    assert d.replica != "a" and d.repinned
    fronts["decode"]["a"], work["decode"]["a"] = 1, 0.0  # a drains: the pin holds again
    assert baton._choose("decode", RoutingRequest((), session="s"), pinned, 0.0).replica == "a"


def test_engines_free_kv_blocks_reach_the_policys_cold_draw():
    """A cold prompt draws two replicas plus one whose engine reports more than half its KV
    free, and takes the least loaded of them: with loads a=c=2 and b=0 the draw holds b only
    when b is the cold one, so every choice is b once b reports its KV free."""
    live = {"decode": {n: {"kv_blocks": 100, "kv_free_blocks": 10} for n in "abc"}, "prefill": {}}
    state = _State(IndexSnapshot([], [], []), live, {"decode": None, "prefill": None},
                   {"decode": {"a": 2, "c": 2}, "prefill": {}})
    routing = _routing("baton")
    live["decode"]["b"]["kv_free_blocks"] = 90
    picks = {routing._choose("decode", RoutingRequest(()), state, 0.0).replica for _ in range(20)}
    assert picks == {"b"}
    live["decode"]["b"]["kv_free_blocks"] = 10  # nobody cold: the two-choice draw sometimes misses b
    picks = {routing._choose("decode", RoutingRequest(()), state, 0.0).replica for _ in range(40)}
    assert picks != {"b"}
