"""Which models of an overcommitted catalogue are resident: routing/policy/residency.py."""

from __future__ import annotations

import math

import pytest

from routing.policy.residency import BUSY_RECHECK_S, Plan, Residency


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
    for t in range(100, 110):
        r.request("a", float(t))
    r.request("b", 110.0)
    # a's demand is 10x b's and a was asked 1 s ago: evictable once idle for 30 s.
    assert r.plan("b", 110.0) == Plan(None, (), 29.0, "pinned")
    assert r.plan("b", 139.0) == Plan("b", ("a",), 0.0, "evict")


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


def test_the_hot_set_is_the_most_wanted_over_a_long_memory_that_fit_beside_a_swap_slot():
    r = pool(capacity=150, a=50, b=50, c=50, d=50)
    for m in "abc":
        r.woke(m, 0.0)
    assert r.favoured(1.0) == {"a", "b", "c"}  # nothing asked yet: every resident one
    for t in range(600):
        r.request("a", float(t))
        if t % 3 == 0:
            r.request("b", float(t))
        if t % 5 == 0:
            r.request("c", float(t))
    # Room 150 less the largest budget (50) holds two: a and b.
    assert r.favoured(600.0) == {"a", "b"}
    for t in range(600, 640):  # a burst of c and d: first in the short demand, not in the long one
        r.request("c", float(t))
        r.request("d", float(t))
    assert r.demand("c", 640.0) > r.demand("b", 640.0) and r.favoured(640.0) == {"a", "b"}
    whole = pool(capacity=200, a=50, b=50, c=50, d=50)
    whole.woke("a", 0.0)
    whole.request("b", 1.0)
    assert whole.favoured(2.0) == {"a"}  # the whole catalogue fits: every resident one


def test_the_hot_set_is_evicted_last_even_below_a_cold_models_recent_demand():
    """b (hot over the long memory) has less short demand than c after c's burst; d's wake takes
    c, the other resident, not b."""
    r = pool(capacity=150, min_resident_s=5.0, a=50, b=50, c=50, d=50)
    for m in "abc":
        r.woke(m, 0.0)
    for t in range(600):
        r.request("a", float(t))
        if t % 3 == 0:
            r.request("b", float(t))
    for t in range(600, 640):
        r.request("c", float(t))
    r.request("d", 660.0)
    assert r.demand("b", 660.0) < r.demand("c", 660.0)
    assert r.plan("d", 660.0) == Plan("d", ("c",), 0.0, "evict")
