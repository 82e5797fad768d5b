"""The shared plan of how many pool permits each front holds."""

from __future__ import annotations

from hypothesis import given, strategies as st

from deployments.admission.lease_plan import plan_targets


def one(_tenant: str) -> float:
    return 1.0


def test_idle_pool_is_split_evenly():
    assert plan_targets(8, {"a": {}, "b": {}}, one) == {"a": 4, "b": 4}
    assert plan_targets(5, {"b": {}, "a": {}}, one) == {"a": 3, "b": 2}  # ties by name


def test_a_tenant_gets_its_fair_share_wherever_its_requests_land():
    # heavy floods both fronts; light's 2 requests all sit on front a.
    plan = plan_targets(8, {"a": {"heavy": 20, "light": 2}, "b": {"heavy": 20}}, one)
    # light's fair share is its whole demand (2); heavy gets the other 6, split 3/3.
    assert plan == {"a": 5, "b": 3}


def test_weights_split_the_pool():
    weights = {"gold": 3.0, "free": 1.0}
    plan = plan_targets(8, {"a": {"gold": 50}, "b": {"free": 50}}, weights.__getitem__)
    assert plan == {"a": 6, "b": 2}


def test_spare_permits_are_spread_so_idle_fronts_admit_at_once():
    plan = plan_targets(8, {"a": {"t": 2}, "b": {}}, one)
    assert plan == {"a": 5, "b": 3}


def test_no_fronts_and_empty_pool():
    assert plan_targets(4, {}, one) == {}
    assert plan_targets(0, {"a": {"t": 3}, "b": {}}, one) == {"a": 0, "b": 0}


@given(st.integers(0, 64),
       st.dictionaries(st.sampled_from("abcd"),
                       st.dictionaries(st.sampled_from(["x", "y", "z"]), st.integers(0, 40), max_size=3),
                       min_size=1))
def test_targets_are_whole_and_add_up_to_the_pool(total, demand):
    plan = plan_targets(total, demand, one)
    assert set(plan) == set(demand)
    assert sum(plan.values()) == total
    assert all(v >= 0 for v in plan.values())


def test_a_front_with_requests_gets_at_least_one_permit():
    plan = plan_targets(8, {"a": {"heavy": 190.0, "light": 20.0}, "b": {"heavy": 0.2}}, one)
    assert plan["b"] == 1 and plan["a"] == 7
