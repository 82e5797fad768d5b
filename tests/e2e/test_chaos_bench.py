"""`baton bench chaos --short`: one fault of each kind on the timed executor, under traffic.

A regression that makes a fault hang a request, cut a stream without an error
event, leave a component down, or lose a batch line or a stored response
fails here, as does an index that claims blocks no engine holds, or a replica's death that
reaches clients whose requests had no byte yet through HAProxy (which runs them again). Its own
stack (colocated, timed executor, serve.ingress haproxy), after the shared stacks
(tests/e2e/conftest.py).
"""

from __future__ import annotations

import json

from bench.chaos import chaos
from bench.chaos.outcomes import BAD


def test_short_chaos_run_hangs_nothing_and_everything_comes_back(tmp_path):
    out = tmp_path / "chaos.json"
    assert chaos.main(["--short", "--out", str(out), "--plot", str(tmp_path / "chaos.png")]) == 0
    doc = json.loads(out.read_text())
    assert [r["fault"] for r in doc["faults"]] == ["decode", "engine", "ingress", "indexer", "redis", "mooncake-store"]
    for r in doc["faults"]:
        assert r["sent"] > 20 and r["silent"] == 0, r
        assert r["component_back_s"] is not None, r
        if r["fault"] == "decode":  # HAProxy runs again what its front had not answered; streams
            # the dying front was answering break (the client sees the transport error)
            assert r["dropped"] == 0 and r["unaffected_share"] >= 0.98, r
        elif r["fault"] == "engine":  # the replica's front forwards to the others at once, and what the
            # dead engine held before its answer began runs again on another replica (99.6-100% in four
            # runs: a stream whose first bytes were on their way at the kill ends with an error event)
            assert sum(r[k] for k in BAD) == 0 and r["unaffected_share"] >= 0.98, r
        elif r["fault"] == "ingress":  # one HAProxy's connections die with it; the other takes new ones:
            # what fails is only what the killed process held at the kill (1-5 connections of ~200 in
            # CI runs, 97.4-99.7% answered; with one process: 92.2-97.8%, docs/bench_chaos.md)
            assert all(r[k] == 0 for k in BAD if k not in ("dropped", "broken")), r
            # Times count from the kill's start. The bench returns from the kill once the process is
            # gone (`signalled_s`); a request sent up to then, or just after, before the client's
            # loop has seen its pooled connection close, met it (run74 failed one sent 1 ms in).
            assert all(f["sent_s"] <= r["signalled_s"] + 0.05 and f["ended_s"] < 1 for f in r["failures"]), r
            assert r["unaffected_share"] >= 0.95, r
        else:
            assert sum(r[k] for k in BAD) == 0, {k: r[k] for k in ("fault", *BAD)}
            assert r["unaffected_share"] >= 0.99, r
        # what must outlive every fault, a Redis kill included (redis.appendfsync); a Responses turn
        # waits out a Redis restart (it read its chain's last response: a 503 per kill before)
        assert r["responses_stored"] > 0 and r["responses_lost"] == 0, r
        if r["fault"] != "ingress":  # a killed HAProxy process drops the connections it held
            assert r["response_turns_failed"] == 0, r
        assert r["batch_status"] == "completed" and r["batch_lost"] == 0 and r["batch_duplicated"] == 0, r
        # The index may forget what a fault hid from it (it then under-predicts), not go on claiming
        # blocks an engine does not hold (sessions sent where their prefix is not). Steady state makes
        # an odd one too, before any kill: 1 of 49 once, 2 of 43 in a CI run on a slow day.
        for window in (r["index_before"], r["index_after"]):
            assert window["over"] <= max(2, 0.05 * sum(window.values())), r
    assert (tmp_path / "chaos.png").stat().st_size > 0
