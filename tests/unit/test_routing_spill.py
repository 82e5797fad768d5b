"""Colocated fronts spill to a peer engine only when their own is full."""

from __future__ import annotations

from routing.policy.spill import SpillChooser


def test_own_engine_first_then_the_peer_with_most_room():
    s = SpillChooser(capacity=4)
    s.update({"b": 3, "c": 1})
    assert s.choose(own_running=3) is None
    assert s.choose(own_running=4) == "c"
    s.started("c")
    s.started("c")
    assert s.choose(own_running=5) == "b"  # b and c have 1 free each: ties go by name
    s.started("b")
    assert s.choose(own_running=5) == "c"
    s.started("c")
    assert s.choose(own_running=5) is None  # everyone is full: run here
    s.finished("c")
    assert s.choose(own_running=5) == "c"


def test_a_fresh_view_replaces_what_was_sent_and_finishing_never_goes_negative():
    s = SpillChooser(capacity=2)
    s.update({"b": 0})
    s.started("b")
    s.started("b")
    assert s.choose(own_running=2) is None
    s.update({"b": 1})  # b's own count now includes what was sent
    assert s.choose(own_running=2) == "b"
    s.finished("b")
    s.finished("b")
    assert s.sent["b"] == 0
    s.update({})
    assert s.choose(own_running=9) is None  # no view of peers (Redis gone): own engine


def test_a_front_whose_engine_died_sends_everything_to_the_peer_with_most_room():
    s = SpillChooser(capacity=4)
    assert s.choose(own_running=0, own_alive=False) is None  # no peer: nowhere else to go
    s.update({"b": 6, "c": 5})
    assert s.choose(own_running=0) is None  # alive and idle: its own engine
    assert s.choose(own_running=0, own_alive=False) == "c"  # both full: the least over
    s.started("c")
    s.started("c")
    assert s.choose(own_running=0, own_alive=False) == "b"
