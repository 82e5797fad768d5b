"""bench/chaos/outcomes.py: what each request ended as, and when goodput came back."""

from __future__ import annotations

import json

from bench.chaos.outcomes import Attempt, counts, goodput_back_s, timeline

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n'
LAST = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
DONE = b"data: [DONE]\n\n"
ERROR_EVENT = b'data: {"error":{"message":"engine replica failed mid-stream","type":"server_error"}}\n\n'


def _plain(body: dict, status: int = 200) -> Attempt:
    return Attempt(stream=False, sent=0.0, status=status, body=json.dumps(body).encode(), ended=1.0)


def _stream(raw: bytes) -> Attempt:
    return Attempt(stream=True, sent=0.0, status=200, body=raw, first_byte=0.1, ended=1.0)


def test_whole_answers_are_ok_or_retried():
    assert _plain({"choices": [{"finish_reason": "stop"}]}).outcome() == "ok"
    assert _plain({"choices": [{"finish_reason": "length"}], "baton": {"retried_after": "ClientOSError"}}
                  ).outcome() == "retried"
    assert _stream(CHUNK + LAST + DONE).outcome() == "ok"


def test_errors_in_openais_shape_are_clean_and_others_are_not():
    assert _plain({"error": {"message": "at capacity", "type": "rate_limit_error"}}, 429).outcome() == "clean_error"
    assert Attempt(stream=False, sent=0, status=502, body=b"<html>bad gateway</html>").outcome() == "unclean_error"
    assert _stream(CHUNK + ERROR_EVENT + DONE).outcome() == "clean_error"


def test_a_cut_stream_is_truncated_and_silence_is_hung_or_dropped():
    assert _stream(CHUNK + CHUNK).outcome() == "truncated"
    assert _stream(CHUNK + LAST).outcome() == "truncated"  # no [DONE]: the stream did not end
    assert _plain({"choices": [{"finish_reason": None}]}).outcome() == "truncated"
    cut = _stream(CHUNK)
    cut.error = "RemoteProtocolError"  # the connection broke: the client knows
    assert cut.outcome() == "broken"
    assert Attempt(stream=True, sent=0, status=200, hung=True).outcome() == "hung"
    assert Attempt(stream=False, sent=0).outcome() == "dropped"


def test_counts_name_every_outcome():
    c = counts([_stream(CHUNK + LAST + DONE), _stream(CHUNK)])
    assert c["ok"] == 1 and c["truncated"] == 1 and c["hung"] == 0 and len(c) == 8


def test_goodput_is_back_when_a_window_reaches_nine_tenths_of_before():
    before = [i * 0.1 for i in range(100)]  # 10/s for 10 s
    gap = [15 + i * 0.1 for i in range(100)]  # nothing from 10 to 15 s, then 10/s again
    assert 4.5 <= goodput_back_s(before + gap, fault_at=10.0, end=25.0) <= 5.0  # a 3 s window reaching past 15 s
    assert goodput_back_s(before + [10 + i * 0.1 for i in range(150)], fault_at=10.0, end=25.0) == 0.0
    assert goodput_back_s(before, fault_at=10.0, end=25.0) is None  # never back
    assert goodput_back_s([], fault_at=10.0, end=25.0) is None  # nothing before to compare with


def test_goodput_settles_after_the_last_dip_not_the_first_good_window():
    """A dip that starts late (a lost site's load lands on its peer a few seconds on): back at the
    first window, settled only after the dip."""
    from bench.chaos.outcomes import goodput_settled_s

    before = [i * 0.1 for i in range(100)]  # 10/s for 10 s
    late_dip = [10 + i * 0.1 for i in range(50)] + [20 + i * 0.1 for i in range(100)]  # none 15-20 s
    assert goodput_back_s(before + late_dip, fault_at=10.0, end=30.0) == 0.0
    assert 9.5 <= goodput_settled_s(before + late_dip, fault_at=10.0, until=30.0) <= 10.0
    steady = before + [10 + i * 0.1 for i in range(200)]
    assert goodput_settled_s(steady, fault_at=10.0, until=30.0) == 0.0
    assert goodput_settled_s(before + [10 + i * 0.1 for i in range(100)], fault_at=10.0, until=30.0) is None
    assert goodput_settled_s([], fault_at=10.0, until=30.0) is None


def test_timeline_bins_good_and_bad_answers_by_when_they_ended():
    t = timeline([_stream(CHUNK + LAST + DONE), _stream(CHUNK)], start=0.0, end=2.0)
    assert t == {"good": [0, 1, 0], "bad": [0, 1, 0]}


def test_fault_names_a_kill_or_a_freeze():
    """`<component>:freeze` stops the component for freeze_s instead of killing it."""
    import pytest

    from bench.chaos.faults import FREEZES, Fault

    kill, freeze = Fault(None, "redis"), Fault(None, "mooncake-store:freeze", freeze_s=7)
    assert (kill.component, kill.freeze_s) == ("redis", None)
    assert (freeze.component, freeze.freeze_s) == ("mooncake-store", 7)
    assert {"decode:freeze", "indexer:freeze"} <= set(FREEZES)  # the indexer: its actor's process stopped
    with pytest.raises(ValueError):
        Fault(None, "router:freeze")


def test_the_catalogue_and_sites_layouts_have_faults_of_their_own():
    """`--layout catalogue` runs one replica and `model-swap`; `--layout sites` runs `site`; each fault
    applies only where its component exists, and the timed executor stays colocated."""
    import pytest

    from bench.chaos.chaos import parse
    from bench.chaos.sites import SiteFault
    from bench.chaos.swap import SwapFault

    assert parse(["--layout", "catalogue", "--faults", "model-swap"]).replicas == 1
    assert parse(["--layout", "sites", "--faults", "site"]).replicas == 1
    assert parse([]).replicas == 2 and parse(["--replicas", "3", "--layout", "catalogue"]).replicas == 3
    with pytest.raises(SystemExit):
        parse(["--layout", "sites", "--engine", "timed"])

    class NoCatalogue:
        url, cfg = "http://127.0.0.1:9", {}

    class Catalogue(NoCatalogue):
        cfg = {"models": [{"id": "baton-small"}, {"id": "baton-deep"}]}

    assert not SwapFault(NoCatalogue(), "baton-tiny").applies()
    swap = SwapFault(Catalogue(), "baton-tiny")
    assert swap.applies() and (swap.resident, swap.cold) == ("baton-small", "baton-deep")
    assert not SiteFault(None).applies() and SiteFault(None).report()["site_processes_killed"] == 0


def _routed(sent: float, session: str | None, replica: str, predicted: int | None, actual: int,
            stream: bool = False) -> Attempt:
    info = {"decode_replica": replica, "predicted_cached_tokens": predicted, "decode_only": True,
            "decode_cached_tokens": actual, "prefill_cached_tokens": None}
    if stream:
        raw = CHUNK + f'data: {json.dumps({"choices": [], "baton": info})}\n\n'.encode() + LAST + DONE
        return Attempt(stream=True, sent=sent, session=session, status=200, body=raw, first_byte=sent, ended=sent + 1)
    a = _plain({"choices": [{"finish_reason": "stop"}], "baton": info})
    a.sent, a.session = sent, session
    return a


def test_routing_recovery_counts_exact_predictions_and_kept_sessions_around_the_fault():
    from bench.chaos.outcomes import prediction, routing

    assert prediction({"predicted_cached_tokens": 32, "decode_only": False, "prefill_cached_tokens": 16}) == "over"
    assert prediction({"predicted_cached_tokens": None}) is None  # colocated, not routed by the index
    attempts = [
        _routed(0.0, "s1", "r1", 0, 0), _routed(1.0, "s1", "r1", 32, 16),  # before the kill at 2: 1 of 2 exact
        _routed(3.0, "s1", "r2", 0, 0),  # during the fault: neither before nor after
        _routed(5.0, "s1", "r2", 32, 32, stream=True),  # after the component was back at 4: kept (r2 again)
        _routed(6.0, "s2", "r1", 16, 16), _routed(7.0, "s2", "r2", 0, 0),  # s2's second turn moved
        _routed(8.0, None, "r1", 0, 0),  # not a session: counts for the index only
    ]
    got = routing(attempts, killed_at=2.0, back_at=4.0)
    assert got == {"index_exact_before": 0.5, "index_exact_after": 1.0, "sessions_kept_after": 0.5,
                   "sessions_kept_before": 1.0,  # s1's turn at 1 stayed on r1
                   "index_before": {"exact": 1, "over": 1, "under": 0}, "index_after": {"exact": 4, "over": 0, "under": 0}}
    assert routing(attempts, 2.0, None)["index_exact_after"] is None  # never back


def test_every_session_turn_continues_its_sessions_whole_prompt():
    """The chaos traffic's sessions (bench/chaos/traffic.py): each turn's prompt begins with its
    session's previous one, so a turn that stayed on its replica finds its context there; a
    session that reached the bound ends, and its slot starts a new session."""
    from bench.chaos.traffic import MAX_PROMPT_CHARS, Traffic

    traffic = Traffic("http://127.0.0.1:1", "m", rate=1.0, sessions=4, seed=3)
    last: dict[str, str] = {}
    one_offs = 0
    for _ in range(2000):
        session, prompt = traffic._turn()
        if session is None:
            one_offs += 1
            continue
        assert len(prompt) <= MAX_PROMPT_CHARS
        assert prompt.startswith(last.get(session, "")), session
        last[session] = prompt
    assert 400 < one_offs < 800  # session_share 0.7
    assert {s.split(".")[0] for s in last} == {f"chaos-{i}" for i in range(4)}
    assert len(last) > 4 * 10  # each slot's sessions ended and new ones began
