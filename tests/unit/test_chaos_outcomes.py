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
    assert "decode:freeze" in FREEZES and "indexer:freeze" not in FREEZES  # Serve's actor: a kill only
    with pytest.raises(ValueError):
        Fault(None, "indexer:freeze")
