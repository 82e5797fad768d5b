"""Which models of an overcommitted catalogue are resident: routing/residency.py."""

from __future__ import annotations

import math

import pytest

from routing.residency import BUSY_RECHECK_S, IDLE_GAPS, Plan, Residency


def pool(capacity: int = 100, min_resident_s: float = 30.0, **budgets: int) -> Residency:
    return Residency(capacity, budgets or {"a": 50, "b": 50, "c": 50}, min_resident_s=min_resident_s)


def apply(r: Residency, p: Plan, now: float) -> None:
    for v in p.evict:
        r.evicted(v)
    if p.wake:
        r.woke(p.wake, now)


def test_a_model_that_fits_wakes_without_eviction():
    r = pool()
    r.woke("a", 0.0)
    assert r.plan("b", 1.0) == Plan("b", (), 0.0, "fits")
    assert r.plan("a", 1.0) == Plan(None, (), 0.0, "resident")
    assert (r.used_bytes(), r.free_bytes(), r.resident()) == (50, 50, ["a"])


def test_least_recently_used_goes_first_when_demand_ties():
    r = pool()
    r.woke("a", 0.0)
    r.woke("b", 1.0)
    assert r.plan("c", 100.0) == Plan("c", ("a",), 0.0, "evict")


def test_least_demand_goes_first_even_if_used_more_recently():
    r = pool()
    r.woke("a", 0.0)
    r.woke("b", 0.0)
    for _ in range(3):
        r.request("a", 50.0)
    r.request("b", 60.0)  # b is the more recently used, but has less demand
    r.request("c", 100.0)
    assert r.plan("c", 100.0) == Plan("c", ("b",), 0.0, "evict")


def test_hysteresis_blocks_a_just_woken_model_and_says_exactly_how_long():
    r = pool(capacity=50)
    r.woke("a", 100.0)
    assert r.plan("b", 110.0) == Plan(None, (), 20.0, "pinned")
    assert r.plan("b", 130.0) == Plan("b", ("a",), 0.0, "evict")


def test_wait_is_until_enough_victims_are_old_enough():
    r = pool(a=50, b=50, c=100)
    r.woke("a", 0.0)
    r.woke("b", 20.0)
    # c needs both; b is the later to become evictable, at 20 + 30.
    assert r.plan("c", 25.0) == Plan(None, (), 25.0, "pinned")
    assert r.plan("c", 50.0) == Plan("c", ("a", "b"), 0.0, "evict")


def test_busy_models_are_never_evicted_but_waited_for():
    r = pool()
    r.woke("a", 0.0)
    r.woke("b", 0.0)
    r.request("b", 50.0)
    # a has the least demand but is busy: the plan waits for it rather than evict the more wanted b.
    assert r.plan("c", 100.0, busy={"a"}) == Plan(None, (), BUSY_RECHECK_S, "pinned")
    assert r.plan("c", 100.0, busy={"a", "b"}) == Plan(None, (), BUSY_RECHECK_S, "pinned")
    assert r.plan("c", 100.0) == Plan("c", ("a",), 0.0, "evict")  # a's requests ended


def test_a_much_busier_model_is_kept_until_it_goes_idle():
    r = pool(capacity=50)
    r.woke("a", 0.0)
    for t in range(0, 600, 2):  # a steady 0.5 requests/s: quiet after 30 s (min_resident_s) > 5 gaps of 2 s
        r.request("a", float(t))
    r.request("b", 599.0)
    # a's demand is far above b's and a was asked 1 s ago: evictable once idle for 30 s.
    assert r.plan("b", 599.0) == Plan(None, (), 29.0, "pinned")
    assert r.plan("b", 628.0) == Plan("b", ("a",), 0.0, "evict")


def test_a_favoured_model_is_quiet_only_after_several_of_its_own_gaps():
    """With min_resident_s 5 and a model asked every 3 s (the only one asked: favoured), a 5 s
    gap is not quiet: it must go IDLE_GAPS mean gaps (15 s) without a request before a much rarer
    model may evict it."""
    r = pool(capacity=50, min_resident_s=5.0)
    r.woke("a", 0.0)
    for t in range(0, 900, 3):
        r.request("a", float(t))
    r.request("b", 902.0)
    assert r.plan("b", 903.0).reason == "pinned"  # 6 s quiet: over min_resident_s, under 5 gaps of 3 s
    assert r.plan("b", 897.0 + IDLE_GAPS * 3 - 0.5).reason == "pinned"
    assert r.plan("b", 897.0 + IDLE_GAPS * 3 + 0.5) == Plan("b", ("a",), 0.0, "evict")


def test_a_burst_is_quiet_after_five_of_its_own_gaps_not_of_a_rate_over_the_half_life():
    """Ten requests a second apart, then silence: quiet 5 s after the last (min_resident_s 5),
    although a rate read from the decayed count (10 requests over a 60 s half-life) is one per 9 s."""
    r = pool(capacity=50, min_resident_s=5.0)
    r.woke("a", 0.0)
    for t in range(100, 110):
        r.request("a", float(t))
    r.request("b", 110.0)
    assert r.plan("b", 113.0).reason == "pinned"
    assert r.plan("b", 114.5) == Plan("b", ("a",), 0.0, "evict")


def test_a_guarded_model_under_the_average_is_evictable_once_idle_for_min_resident():
    """c is asked three times as often as d, so the guard holds it while in use, but less than the
    average model (a dominates): once idle for min_resident_s, d may take its place."""
    r = pool(capacity=100, min_resident_s=5.0, a=50, c=50, d=50, e=50)
    r.woke("a", 0.0)
    r.woke("c", 0.0)
    for t in range(593):
        r.request("a", float(t))
        if t % 10 == 0:
            r.request("c", float(t))  # last at 590
        if t % 30 == 0:
            r.request("d", float(t))
    assert r.favoured(592.0) == {"a"} and r.demand("c", 592.0) > 2 * r.demand("d", 592.0)
    assert r.plan("d", 592.0) == Plan(None, (), 3.0, "pinned")  # c idle 2 s of 5
    assert r.plan("d", 595.5) == Plan("d", ("c",), 0.0, "evict")  # not IDLE_GAPS x 10 s


def test_a_comparable_requester_may_evict_a_model_in_use():
    r = pool(capacity=50)
    r.woke("a", 0.0)
    r.request("a", 100.0)
    r.request("b", 100.0)
    assert r.plan("b", 100.0) == Plan("b", ("a",), 0.0, "evict")


def test_two_alternating_models_swap_at_most_once_per_min_resident():
    r = pool(capacity=50, min_resident_s=30.0)
    wakes: list[float] = []
    for t in range(300):
        now = float(t)
        model = "ab"[t % 2]
        r.request(model, now)
        p = r.plan(model, now)
        if p.wake:
            apply(r, p, now)
            wakes.append(now)
    assert 2 <= len(wakes) <= 1 + 300 // 30
    assert all(b - a >= 30.0 for a, b in zip(wakes, wakes[1:]))


def test_a_model_bigger_than_the_pool_is_too_big():
    r = pool(capacity=100, huge=101)
    assert r.plan("huge", 0.0) == Plan(None, (), math.inf, "too_big")


def test_woke_over_capacity_raises():
    r = pool()
    r.woke("a", 0.0)
    r.woke("b", 0.0)
    with pytest.raises(ValueError):
        r.woke("c", 0.0)
    assert r.resident() == ["a", "b"]
    r.evicted("a")
    r.woke("c", 1.0)
    assert r.resident() == ["b", "c"]


def test_demand_halves_after_half_life():
    r = Residency(100, {"a": 10}, half_life_s=60.0)
    assert r.demand("a", 0.0) == 0.0
    r.request("a", 0.0)
    first = r.demand("a", 0.0)
    assert first == pytest.approx(math.log(2) / 60.0)
    assert r.demand("a", 60.0) == pytest.approx(first / 2)
    assert r.demand("a", 120.0) == pytest.approx(first / 4)


def test_steady_arrivals_read_as_their_rate():
    r = Residency(100, {"a": 10}, half_life_s=10.0)
    for i in range(2000):
        r.request("a", i * 0.5)  # 2 requests/s
    assert r.demand("a", 999.5) == pytest.approx(2.0, rel=0.05)


def test_plan_changes_nothing_and_unknown_models_raise():
    r = pool(capacity=50)
    r.woke("a", 0.0)
    r.plan("b", 100.0)
    assert r.resident() == ["a"]
    for call in (lambda: r.plan("x", 0.0), lambda: r.request("x", 0.0),
                 lambda: r.woke("x", 0.0), lambda: r.evicted("x"), lambda: r.demand("x", 0.0)):
        with pytest.raises(KeyError):
            call()


def test_a_rarely_used_model_waits_for_the_rarely_used_slot_instead_of_evicting_a_model_in_use():
    """Room for two: hot `a` in steady use and cold `b` resident; cold `c` evicts `b`, never `a`,
    even when `b` has just woken and `a` is evictable by residence time alone."""
    r = pool()
    r.woke("a", 0.0)
    for t in range(0, 100, 2):
        r.request("a", float(t))
    r.request("b", 90.0)
    r.woke("b", 90.0)
    r.request("c", 100.0)
    plan = r.plan("c", 100.0)
    assert plan == Plan(None, (), 20.0, "pinned")  # b may go at 120; a is more wanted than c
    assert r.plan("c", 120.0).evict == ("b",)


def test_the_plan_waits_for_the_least_wanted_victim_rather_than_evict_a_more_wanted_one_now():
    r = pool(capacity=150, a=50, b=50, c=50, d=50)  # room for three: hot `a`, warm `b`, `c` woken just now
    r.woke("a", 0.0)
    r.woke("b", 0.0)
    for t in range(0, 100, 5):
        r.request("a", float(t))
        r.request("b", float(t) + 1)
    r.woke("c", 95.0)
    r.request("d", 100.0)  # b is evictable now (resident long, d not 2x below it); c is the least wanted
    assert r.plan("d", 100.0) == Plan(None, (), 25.0, "pinned")
    assert r.plan("d", 125.0).evict == ("c",)


def test_favoured_are_the_resident_models_asked_at_least_as_often_as_the_average():
    r = pool(capacity=150, a=50, b=50, c=50, d=50)
    for m in "abc":
        r.woke(m, 0.0)
    assert r.favoured(1.0) == {"a", "b", "c"}  # nothing asked yet: every resident one
    for t in range(60):
        r.request("a", float(t))
        if t % 3 == 0:
            r.request("b", float(t))
    r.request("c", 59.0)
    r.request("d", 59.0)
    # a 60, b 20, c 1, d 1 (not resident): the mean is 20.5 requests' worth, b just under it.
    assert r.favoured(60.0) == {"a"}
    for t in range(60, 64):
        r.request("b", float(t))
    assert r.favoured(64.0) == {"a", "b"}
