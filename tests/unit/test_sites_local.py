"""`baton bench sites --local`'s pure parts (bench/sites/sites_local.py): the alternating order of the
policies' segments, and pooling a policy's segments into one summary."""

from __future__ import annotations

from bench.sites.sites_local import _minus, _pool, segment_order, summarize


def test_segments_alternate_their_order_round_by_round():
    assert segment_order(["x", "y", "z"], 2) == [(0, "x"), (0, "y"), (0, "z"), (1, "z"), (1, "y"), (1, "x")]
    assert segment_order(["x", "y"], 3) == [(0, "x"), (0, "y"), (1, "y"), (1, "x"), (2, "x"), (2, "y")]
    # over two rounds every policy's mean position is the same: a linear drift falls on each alike
    order = segment_order(["x", "y", "z"], 2)
    means = {p: sum(i for i, (_, q) in enumerate(order) if q == p) / 2 for p in "xyz"}
    assert len(set(means.values())) == 1


def _result(origin, site, session, turn, status=200, cached=0, prompt=100):
    return {"at": 20.0, "origin": origin, "status": status, "site": site, "seconds": 0.5, "session": session,
            "turn": turn, "prompt_tokens": prompt, "cached_tokens": cached}


def test_segments_pool_into_one_summary_per_policy():
    acc = {"results": [], "busy": {"a": [], "b": []}, "decisions": {}, "forwards": {}, "cpu_throttled": {}}
    # round 0: a session kept on a; round 1: the same plan's session (tagged apart) moved to b
    seg0 = {"results": [_result("a", "a", "r0-s1", 0), _result("a", "a", "r0-s1", 1, cached=90)],
            "busy": {"a": [1.0, 1.0], "b": [0.0, 0.0]}, "decisions": {"local": 2}, "forwards": {},
            "cpu_throttled": {"a": {"throttled_s": 1.5}}}
    seg1 = {"results": [_result("a", "a", "r1-s1", 0), _result("a", "b", "r1-s1", 1),
                        _result("a", "a", None, 0, status=429)],
            "busy": {"a": [0.5, 0.5], "b": [0.5, 0.5]}, "decisions": {"local": 1, "spill": 1, "rejected": 1},
            "forwards": {"served": 1}, "cpu_throttled": {"a": {"throttled_s": 0.5}}}
    _pool(acc, seg0)
    _pool(acc, seg1)
    assert acc["decisions"] == {"local": 3, "spill": 1, "rejected": 1} and acc["forwards"] == {"served": 1}
    assert acc["cpu_throttled"] == {"a": {"throttled_s": 2.0}}
    s = summarize(acc["results"], acc["busy"])
    assert (s["requests"], s["served"], s["rejected"]) == (5, 4, 1)
    assert s["utilisation"] == {"a": 0.75, "b": 0.25} and s["util_max_over_mean"] == 1.5
    assert s["session_turns_2plus"] == 2 and s["session_keep"] == 0.5
    assert s["session_keep_by_first"] == {"home": 0.5, "away": None}
    assert s["turn2_cached_share"] == 0.45  # 90 of 200 prompt tokens
    assert s["forwarded_share"] == 0.25 and s["added_rtt_ms"]["forwarded_p50"] == 20.0


def test_counter_differences_keep_what_moved():
    assert _minus({"served": 5, "refused": 2, "x": 1}, {"served": 3, "x": 1}) == {"served": 2, "refused": 2}
