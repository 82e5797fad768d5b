"""bench affinity's per-run statistics: TTFTs by turn, cached share, and what the errors were."""

from __future__ import annotations

from bench.affinity.affinity import routing_counts, session_routes, turn_stats
from bench.common.loadgen import RequestResult


def test_turn_stats_split_turns_and_name_the_errors():
    results = [RequestResult(0, "s", 0, ttft_s=2.0, input_tokens=100),
               RequestResult(1, "s", 1, ttft_s=1.0, input_tokens=200, cached_tokens=150),
               RequestResult(2, "t", 1, error="ClientResponseError: 429, message='Too Many Requests'"),
               RequestResult(3, "t", 2, error="ClientResponseError: 429, message='Too Many Requests'"),
               RequestResult(4, "u", 1, error="timeout after 600s")]
    stats = turn_stats(results)
    assert (stats["requests_ok"], stats["errors"]) == (2, 3)
    assert stats["ttft_turn1_p50_s"] == 2.0 and stats["ttft_turn2plus_p50_s"] == 1.0
    assert stats["cached_share_turn2plus"] == 0.75
    assert stats["error_kinds"] == {"ClientResponseError: 429, message='Too Many Requests'": 2,
                                    "timeout after 600s": 1}


def test_routing_counts_read_decisions_and_repins_from_a_metrics_page():
    page = "\n".join([
        "# HELP baton_route_decisions_total routing decisions",
        'baton_route_decisions_total{pool="prefill",reason="pinned"} 12.0',
        'baton_route_decisions_total{pool="prefill",reason="load"} 3.0',
        'baton_route_decisions_total{pool="decode",reason="prefix"} 1.0',
        'baton_repins_total{pool="prefill"} 2.0',
        'baton_route_decisions_created{pool="prefill",reason="load"} 1.7e9',
        "baton_prefix_hit_ratio 0.5",
    ])
    assert routing_counts(page) == {"decode/prefix": 1, "prefill/load": 3, "prefill/pinned": 12,
                                    "prefill/repins": 2}


def test_session_routes_follow_each_session_from_turn_to_turn():
    def res(i, session, turn, prefill, route, predicted, cached, decode="d0"):
        return RequestResult(i, session, turn, cached_tokens=cached,
                             baton={"route": route, "prefill_replica": prefill, "decode_replica": decode,
                                    "predicted_cached_tokens": predicted, "decode_only": prefill is None})
    # Out of order on purpose: sessions are followed by turn, not by arrival.
    results = [res(2, "s", 2, "p1", "load", 0, 0),
               res(0, "s", 0, "p0", "load", 0, 0),
               res(1, "s", 1, "p0", "pinned", 512, 512),
               res(3, "t", 0, "p1", "load", 0, 0),
               res(4, "t", 1, None, "prefix", 640, 600, decode="d1"),
               RequestResult(5, "t", 2, error="timeout after 600s")]
    assert session_routes(results) == {
        "turns": 3, "reason/pinned": 1, "reason/load": 1, "reason/prefix": 1, "decode_only": 1,
        "prefill/same_as_last_turn": 1, "prefill/moved": 1,
        "decode/same_as_last_turn": 2, "decode/moved": 1, "predicted_exact": 2, "first_turns_on/d0": 2}


def test_median_ratio_interval_brackets_the_ratio_and_narrows_with_samples():
    from bench.affinity.affinity import median_ratio_interval

    assert median_ratio_interval([], [1.0]) is None
    lo, hi = median_ratio_interval([1.0] * 5, [2.0] * 5)
    assert lo == hi == 0.5  # no spread, no doubt
    a = [0.8 + 0.01 * i for i in range(40)]  # p50 ~1.0
    b = [1.6 + 0.02 * i for i in range(40)]  # p50 ~2.0
    lo, hi = median_ratio_interval(a, b)
    assert lo <= 0.5 <= hi and hi - lo < 0.1
    wide = median_ratio_interval(a[::8], b[::8])
    assert wide[1] - wide[0] > hi - lo


def test_pool_runs_pool_repeats_and_keep_each_repeats_ratio():
    from bench.affinity.affinity import _pool_runs

    def run(ttfts):
        return [RequestResult(i, f"s{i}", 1, ttft_s=t, input_tokens=10, baton={"route": "pinned"})
                for i, t in enumerate(ttfts)]
    results = {"baton": run([1.0, 1.0, 3.0, 3.0]), "round_robin": run([2.0, 2.0, 2.0, 2.0])}
    per_repeat = [{"baton": turn_stats(results["baton"][:2]), "round_robin": turn_stats(results["round_robin"][:2])},
                  {"baton": turn_stats(results["baton"][2:]), "round_robin": turn_stats(results["round_robin"][2:])}]
    runs = _pool_runs(["baton", "round_robin"], per_repeat, results)
    assert runs["baton"]["requests_ok"] == 4 and len(runs["baton"]["repeats"]) == 2
    ratios = runs["ratio_to_round_robin"]["baton"]
    assert ratios["turn2plus_p50_by_repeat"] == [0.5, 1.5]
    assert ratios["ttft_turn2plus_p50_s"] == 1.0  # the pooled medians: 2.0 / 2.0
    assert ratios["turn2plus_p50_interval_90"][0] <= 1.0 <= ratios["turn2plus_p50_interval_90"][1]
    single = _pool_runs(["baton", "round_robin"], per_repeat[:1], results)
    assert "repeats" not in single["baton"] and single["ratio_to_round_robin"]["baton"]["ttft_turn2plus_p50_s"] == 0.5
    assert runs["baton"]["turn2plus_routes"]["reason/pinned"] == 4  # where the pooled turns went


def test_moves_compare_each_moved_turns_ttft_with_the_predicted_stay(tmp_path):
    from bench.affinity.affinity import moves
    from bench.affinity.affinity_plot import plot

    def turn(i, route, ttft, stay=None, predicted=None):
        return RequestResult(i, f"s{i}", 1, ttft_s=ttft, baton={"route": route, "stay_s": stay, "predicted_s": predicted})
    results = [turn(0, "moved", 1.0, stay=3.0, predicted=0.9), turn(1, "moved", 4.0, stay=3.0, predicted=1.0),
               turn(2, "pinned", 2.0, stay=2.0, predicted=2.0), turn(3, "moved", 1.0),
               RequestResult(4, "s4", 0, ttft_s=9.0, baton={"route": "moved", "stay_s": 1.0})]  # a first turn
    out = moves(results)
    assert (out["moves"], out["paid"], out["paid_share"]) == (3, 1, 0.5)  # the unpriced move is not judged
    assert out["each"][0] == {"pools": ["decode"], "stay_s": 3.0, "predicted_s": 0.9, "ttft_s": 1.0}
    prefill_moved = RequestResult(5, "s5", 2, ttft_s=1.0, baton={"route": "pinned", "moved": ["prefill"], "stay_s": 2.0})
    assert moves([prefill_moved])["each"][0]["pools"] == ["prefill"]
    assert moves([])["paid_share"] is None
    doc = {"workload": {}, "pd": {"pool_on": {"baton": {**turn_stats(results), "moves": out},
                                              "round_robin": turn_stats(results)}}}
    plot([doc], tmp_path / "affinity.png")
    assert (tmp_path / "affinity.png").stat().st_size > 0
