"""`baton bench spec`'s bookkeeping (bench/spec/spec.py), on made-up results."""

from __future__ import annotations

from bench.spec.spec import compare, targets


def _w(tpot, answers, rate=None):
    return {"tpot_p50_ms": tpot, "answers": answers, "acceptance_rate": rate}


def test_ratios_and_identical_answers_are_against_the_same_modes_off_run():
    results = {("colocated", "off"): {"tool_echo": _w(4.0, ["a", "b"]), "free_text": _w(3.0, ["x"])},
               ("colocated", "ngram"): {"tool_echo": _w(2.0, ["a", "c"], 0.8), "free_text": _w(3.1, ["x"], 0.1)},
               ("colocated", "draft"): {"error": "did not start"},
               ("disaggregated", "off"): {"tool_echo": _w(5.0, ["a", "b"])},
               ("disaggregated", "ngram"): {"tool_echo": _w(3.0, ["a", "b"], 0.78)}}
    compare(results)
    echo = results[("colocated", "ngram")]["tool_echo"]
    assert echo["tpot_p50_vs_off"] == 0.5 and echo["identical_to_off"] == 0.5 and "answers" not in echo
    assert results[("disaggregated", "ngram")]["tool_echo"]["tpot_p50_vs_off"] == 0.6
    t = targets(results)
    assert t["tool_echo_best_tpot_vs_off"] == 0.5 and t["tool_echo_ok"]
    assert t["tool_echo_identical_min"] == 0.5 and not t["identical_ok"]
    assert t["free_text_ngram_tpot_vs_off"] == round(3.1 / 3.0, 3) and t["free_text_ok"]
    assert t["disaggregated_ngram_acceptance_vs_colocated"] == round(0.78 / 0.8, 3) and t["disaggregated_ngram_ok"]
