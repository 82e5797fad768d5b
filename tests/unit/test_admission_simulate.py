import pytest

from deployments.admission import (
    AdmissionConfig, ShedReason, max_min_fair_share, priority_fair_share, simulate_overload,
    two_tenant_load,
)

CFG = AdmissionConfig(capacity_per_replica=4, max_queue_per_tenant=50, max_queue_total=80,
                      default_deadline_s=5.0)
SERVICE_S, DURATION_S, REPLICAS = 1.0, 200.0, 2  # capacity 8 requests/s


def test_max_min_fair_share_water_filling():
    assert max_min_fair_share({"a": 1.0, "b": 10.0}, {"a": 1, "b": 1}, 8.0) == {"a": 1.0, "b": 7.0}
    assert max_min_fair_share({"a": 5.0, "b": 10.0}, {"a": 1, "b": 1}, 8.0) == {"a": 4.0, "b": 4.0}
    assert max_min_fair_share({"a": 9.0, "b": 9.0}, {"a": 2, "b": 1}, 9.0) == {"a": 6.0, "b": 3.0}
    assert max_min_fair_share({"a": 1.0, "b": 0.0}, {"a": 1, "b": 1}, 8.0) == {"a": 1.0, "b": 0.0}


@pytest.mark.parametrize("load_x", [1, 2, 5])
def test_light_tenant_keeps_its_fair_share_against_a_10x_tenant(load_x):
    offered = two_tenant_load(load_x, 8.0, heavy_factor=10)
    r = simulate_overload(CFG, offered, SERVICE_S, DURATION_S, replicas=REPLICAS)
    light, heavy = r.tenants["light"], r.tenants["heavy"]
    assert r.capacity_rps == 8.0
    assert light.fair_share_rps == pytest.approx(min(offered["light"], 4.0))
    assert light.fair_share_ratio >= 0.9
    assert light.shed == {} and light.successes == light.offered
    # Nothing is lost: every request either succeeds or is shed with a reason.
    for t in (light, heavy):
        assert t.offered == t.successes + sum(t.shed.values())
        assert set(t.shed) <= set(ShedReason)
    # The engines stay busy: together the tenants use the capacity they ask for.
    assert light.goodput_rps + heavy.goodput_rps >= 0.95 * min(8.0, sum(offered.values()))


@pytest.mark.parametrize("heavy_rps", [8.0, 40.0])  # 2x and 10x its fair share of 4/s
def test_light_tenant_at_exactly_half_capacity(heavy_rps):
    r = simulate_overload(CFG, {"light": 4.0, "heavy": heavy_rps}, SERVICE_S, DURATION_S, REPLICAS)
    assert r.tenants["light"].fair_share_ratio >= 0.9
    assert r.tenants["heavy"].fair_share_ratio >= 0.9  # it is not starved either


def test_push_out_keeps_fairness_when_the_global_queue_is_the_bound():
    cfg = AdmissionConfig(capacity_per_replica=4, max_queue_per_tenant=10, max_queue_total=10,
                          default_deadline_s=100.0)
    r = simulate_overload(cfg, two_tenant_load(5, 8.0), SERVICE_S, DURATION_S, REPLICAS)
    assert r.tenants["light"].fair_share_ratio >= 0.9
    assert r.tenants["heavy"].shed.get(ShedReason.DISPLACED, 0) > 0


def test_tenant_weights_split_capacity_2_to_1():
    cfg = AdmissionConfig(capacity_per_replica=4, max_queue_per_tenant=100, max_queue_total=200,
                          default_deadline_s=5.0, tenant_weights={"g": 2.0})
    r = simulate_overload(cfg, {"g": 20.0, "f": 20.0}, SERVICE_S, DURATION_S, REPLICAS)
    assert r.tenants["g"].fair_share_rps == pytest.approx(16 / 3)
    assert r.tenants["f"].fair_share_rps == pytest.approx(8 / 3)
    for t in r.tenants.values():
        assert 0.9 <= t.fair_share_ratio <= 1.1


def test_interactive_takes_capacity_before_batch():
    # A short batch queue, so what drains after the run barely counts.
    cfg = AdmissionConfig(capacity_per_replica=4, max_queue_per_tenant=8, max_queue_total=16,
                          default_deadline_s=5.0, tier_deadlines_s={"batch": 600.0})
    # i asks for 6 of the 8/s; the batch tenant gets the 2/s left, not half.
    r = simulate_overload(cfg, {"i": 6.0, "b": 20.0}, SERVICE_S, DURATION_S, REPLICAS,
                          tiers={"b": "batch"})
    i, b = r.tenants["i"], r.tenants["b"]
    assert (i.fair_share_rps, b.fair_share_rps) == (pytest.approx(6.0), pytest.approx(2.0))
    assert i.shed == {} and i.successes == i.offered
    assert 0.9 <= b.fair_share_ratio <= 1.1


def test_priority_fair_share_fills_tiers_in_order():
    cfg = AdmissionConfig(tenant_tiers={"b": "batch", "c": "batch"}, tenant_weights={"c": 3.0})
    share = priority_fair_share(cfg, {"i": 5.0, "b": 10.0, "c": 10.0, "x": 2.0}, {"x": "batch"}, 8.0)
    # i takes its 5; batch splits the 3 left by weight 1:1:3 (x asked for batch).
    assert share == {"i": 5.0, "x": pytest.approx(0.6), "b": pytest.approx(0.6), "c": pytest.approx(1.8)}
    # A tenant may not raise itself: b asking for interactive stays in batch.
    assert priority_fair_share(cfg, {"i": 8.0, "b": 8.0}, {"b": "interactive"}, 8.0) == {"i": 8.0, "b": 0.0}


def test_simulation_is_deterministic():
    offered = two_tenant_load(2, 8.0)
    assert simulate_overload(CFG, offered, SERVICE_S, 50.0, REPLICAS) == \
        simulate_overload(CFG, offered, SERVICE_S, 50.0, REPLICAS)


def test_under_capacity_nobody_is_shed():
    r = simulate_overload(CFG, {"a": 3.0, "b": 3.0}, SERVICE_S, DURATION_S, REPLICAS)
    for t in r.tenants.values():
        assert t.shed == {} and t.successes == t.offered
