"""Priority tiers through the config and the controller: resolution, strict
priority, push-out across tiers, per-tier deadlines, validation messages."""

import pytest
from pydantic import ValidationError

from deployments.admission import Admission, AdmissionConfig, ShedReason, TicketState


def cfg(**kw) -> AdmissionConfig:
    base = dict(capacity_per_replica=1, max_queue_per_tenant=10, max_queue_total=20,
                default_deadline_s=100.0, tenant_tiers={"bulk": "batch"})
    base.update(kw)
    return AdmissionConfig(**base)


@pytest.mark.parametrize("kw, field", [
    (dict(capacity_per_replica=0), "capacity_per_replica"),
    (dict(max_queue_per_tenant=-1), "max_queue_per_tenant"),
    (dict(max_queue_per_tenant=30, max_queue_total=20), "max_queue_total"),
    (dict(default_deadline_s=0.0), "default_deadline_s"),
    (dict(tiers=[]), "tiers"),
    (dict(tiers=["a", "a"]), "tiers"),
    (dict(default_tier="gold"), "default_tier"),
    (dict(tenant_tiers={"acme": "gold"}), "tenant_tiers"),
    (dict(tenant_weights={"acme": 0.0}), "tenant_weights"),
    (dict(tenant_weights={"acme": float("inf")}), "tenant_weights"),
    (dict(default_weight=-1.0), "default_weight"),
    (dict(tier_deadlines_s={"gold": 10.0}), "tier_deadlines_s"),
    (dict(tier_deadlines_s={"batch": 0.0}), "tier_deadlines_s"),
    (dict(tier_deadlines_s={"batch": float("nan")}), "tier_deadlines_s"),
    (dict(tier_weights={"default": 1.0}), "tier_weights"),  # gone: extra fields are errors
    (dict(ewma_alpha=0.0), "ewma_alpha"),
    (dict(max_retry_after_s=0), "max_retry_after_s"),
])
def test_config_validation_names_the_field(kw, field):
    with pytest.raises(ValidationError, match=field):
        cfg(**kw)


def test_tier_of_never_raises_a_tenant_above_its_tier():
    c = cfg(tiers=["interactive", "standard", "batch"], default_tier="standard",
            tenant_tiers={"vip": "interactive", "bulk": "batch"})
    assert [c.tier_of("vip"), c.tier_of("anon"), c.tier_of("bulk")] == ["interactive", "standard", "batch"]
    assert [c.tier_of("vip", t) for t in c.tiers] == ["interactive", "standard", "batch"]
    assert [c.tier_of("anon", t) for t in c.tiers] == ["standard", "standard", "batch"]
    assert [c.tier_of("bulk", t) for t in c.tiers] == ["batch", "batch", "batch"]
    with pytest.raises(ValueError, match="unknown priority tier 'gold'"):
        c.tier_of("vip", "gold")


def test_weights_and_deadlines_fall_back_to_the_defaults():
    c = cfg(tenant_weights={"g": 2.0}, default_weight=0.5, tier_deadlines_s={"batch": 600.0})
    assert (c.weight_of("g"), c.weight_of("other")) == (2.0, 0.5)
    assert (c.deadline_of("batch"), c.deadline_of("interactive")) == (600.0, 100.0)
    with pytest.raises(ValueError, match="unknown priority tier"):
        c.deadline_of("gold")


def test_submit_resolves_tier_weight_and_tier_deadline():
    adm = Admission(cfg(tenant_weights={"bulk": 3.0}, tier_deadlines_s={"batch": 600.0}))
    adm.submit("a", None, 0.0)  # takes the one permit
    up = adm.submit("bulk", "interactive", 1.0)  # may not raise itself
    down = adm.submit("a", "batch", 1.0)  # may lower itself
    fixed = adm.submit("a", "batch", 1.0, deadline_s=5.0)
    assert (up.tier, up.weight, up.deadline) == ("batch", 3.0, 601.0)
    assert (down.tier, down.weight, down.deadline) == ("batch", 1.0, 601.0)
    assert fixed.deadline == 6.0
    with pytest.raises(ValueError, match="unknown priority tier"):
        adm.submit("a", "gold", 1.0)
    assert adm.stats["a"].submitted == 3 and len(adm.queue) == 3  # the bad request changed nothing


def test_batch_waits_while_any_interactive_request_is_queued():
    adm = Admission(cfg())
    current = adm.submit("a", None, 0.0)
    b = [adm.submit("bulk", None, 0.0) for _ in range(2)]
    i1 = adm.submit("a", None, 0.0)
    (current,) = adm.release(current, 1.0).admitted
    assert current is i1
    i2 = adm.submit("c", "interactive", 1.5)  # arrives after the batch requests
    order = []
    for now in (2.0, 3.0, 4.0):
        (current,) = adm.release(current, now).admitted
        order.append(current)
    assert order == [i2, b[0], b[1]]
    assert adm.snapshot().tier_queue_len == {"interactive": 0, "batch": 0}


def test_batch_is_admitted_at_once_when_nothing_waits():
    adm = Admission(cfg(capacity_per_replica=2))
    assert adm.submit("bulk", None, 0.0).admitted
    assert adm.submit("a", "batch", 0.0).admitted


def test_interactive_pushes_out_batch_when_the_queue_is_full():
    adm = Admission(cfg(max_queue_per_tenant=2, max_queue_total=2))
    adm.submit("a", None, 0.0)  # holds the permit
    b1, b2 = adm.submit("bulk", None, 0.0), adm.submit("bulk", None, 0.0)
    i1 = adm.submit("a", None, 0.0)
    assert i1.state is TicketState.QUEUED and i1.displaced == [b2]
    assert (b2.state, b2.reason) == (TicketState.SHED, ShedReason.DISPLACED) and b2.retry_after_s >= 1
    i2 = adm.submit("c", None, 0.0)
    assert i2.displaced == [b1] and adm.snapshot().tier_queue_len == {"interactive": 2, "batch": 0}
    full = adm.submit("d", None, 0.0)  # only interactive left: c (0+1) is not shorter than a 1
    assert (full.state, full.reason) == (TicketState.SHED, ShedReason.QUEUE_FULL)
    assert adm.stats["bulk"].shed == {ShedReason.DISPLACED: 2}


def test_deadline_rejection_counts_the_interactive_requests_ahead():
    adm = Admission(cfg())
    first = adm.submit("a", None, 0.0)
    adm.submit("a", None, 0.0)
    adm.release(first, 2.0)  # service time 2 s; the second holds the permit now
    for _ in range(3):
        adm.submit("c", None, 2.0)
    # A batch request with 3 interactive ahead waits (3 + 1) * 2 s = 8 s.
    late = adm.submit("bulk", None, 2.0, deadline_s=7.0)
    assert (late.state, late.reason, late.retry_after_s) == (TicketState.SHED, ShedReason.DEADLINE, 1)
    ok = adm.submit("bulk", None, 2.0, deadline_s=8.0)
    assert ok.state is TicketState.QUEUED and ok.expected_wait_s == 8.0
    # An interactive newcomer waits behind c's first request only: (1 + 1) * 2 s.
    assert adm.submit("d", None, 2.0, deadline_s=4.0).expected_wait_s == 4.0
