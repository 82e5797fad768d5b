"""bench affinity's per-run statistics: TTFTs by turn, cached share, and what the errors were."""

from __future__ import annotations

from bench.affinity import routing_counts, session_routes, turn_stats
from bench.loadgen import RequestResult


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
