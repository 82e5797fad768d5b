"""LatencyMap: smoothing, expiry (a dead site drops out, rejoins fresh), direction fallback,
neighbour order, pruning, merge and the JSON round trip."""

from __future__ import annotations


import pytest

from routing.sites.latency_map import LatencyMap


def test_first_probe_sets_then_ewma_smooths():
    m = LatencyMap(ttl_s=30, alpha=0.5)
    assert m.rtt("a", "b", 0.0) is None
    m.observe("a", "b", 0.010, now=0.0)
    assert m.rtt("a", "b", 1.0) == pytest.approx(0.010)
    m.observe("a", "b", 0.020, now=5.0)
    assert m.rtt("a", "b", 5.0) == pytest.approx(0.015)
    m.observe("a", "b", 0.020, now=10.0)
    assert m.rtt("a", "b", 10.0) == pytest.approx(0.0175)
    assert m.rtt("a", "a", 10.0) == 0.0


def test_entry_expires_after_ttl_and_restarts_fresh():
    m = LatencyMap(ttl_s=30, alpha=0.5)
    m.observe("a", "b", 0.010, now=0.0)
    assert m.rtt("a", "b", 30.0) == pytest.approx(0.010)  # exactly ttl old: still fresh
    assert m.rtt("a", "b", 30.01) is None
    m.observe("a", "b", 0.050, now=40.0)  # the old value must not be averaged in
    assert m.rtt("a", "b", 40.0) == pytest.approx(0.050)


def test_dead_site_drops_out_of_neighbours_and_rejoins():
    m = LatencyMap(ttl_s=10)
    for t in (0.0, 5.0):
        m.observe("a", "b", 0.004, t)
        m.observe("a", "c", 0.008, t)
    # c stops answering after t=5; b keeps answering.
    for t in (10.0, 15.0):
        m.observe("a", "b", 0.004, t)
    assert [n for n, _ in m.neighbours("a", 14.0)] == ["b", "c"]
    assert [n for n, _ in m.neighbours("a", 15.1)] == ["b"]
    assert m.sites(15.1) == {"a", "b"}
    m.observe("a", "c", 0.008, 20.0)
    assert [n for n, _ in m.neighbours("a", 20.0)] == ["b", "c"]


def test_reverse_direction_stands_in_and_own_measurement_wins():
    m = LatencyMap(ttl_s=10)
    m.observe("b", "a", 0.006, 0.0)
    assert m.rtt("a", "b", 1.0) == pytest.approx(0.006)
    assert m.neighbours("a", 1.0) == [("b", pytest.approx(0.006))]
    m.observe("a", "b", 0.004, 1.0)
    assert m.rtt("a", "b", 2.0) == pytest.approx(0.004)
    assert m.rtt("b", "a", 2.0) == pytest.approx(0.006)
    assert m.rtt("a", "b", 10.5) == pytest.approx(0.004)  # b's expired, a's not yet
    assert m.rtt("b", "a", 10.5) == pytest.approx(0.004)


def test_neighbours_nearest_first_ties_by_name_self_excluded():
    m = LatencyMap(ttl_s=10)
    for dst, r in (("z", 0.003), ("y", 0.003), ("x", 0.001), ("w", 0.009)):
        m.observe("a", dst, r, 0.0)
    m.observe("x", "a", 0.001, 0.0)
    assert [n for n, _ in m.neighbours("a", 0.0)] == ["x", "y", "z", "w"]
    assert [n for n, _ in m.neighbours("x", 0.0)] == ["a"]  # not itself


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        LatencyMap(ttl_s=0)
    with pytest.raises(ValueError):
        LatencyMap(ttl_s=10, alpha=0)
    m = LatencyMap(ttl_s=10)
    with pytest.raises(ValueError):
        m.observe("a", "a", 0.001, 0.0)
    with pytest.raises(ValueError):
        m.observe("a", "b", -0.001, 0.0)
    with pytest.raises(ValueError):
        m.observe("a", "b", float("nan"), 0.0)
