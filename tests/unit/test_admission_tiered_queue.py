import math

import pytest

from deployments.admission import Admit, Popped, Reject, ShedReason, TieredQueue

FAR = 1e9  # a deadline that never matters
TIERS = ("interactive", "batch")


def drain(q: TieredQueue, now: float = 0.0) -> list:
    out = []
    while (p := q.pop(now)).item is not None:
        out.append(p.item)
    return out


def one_tier(**kw) -> TieredQueue:
    return TieredQueue(["only"], **kw)


def test_higher_tier_is_always_served_first():
    q = TieredQueue(TIERS, 10, 20)
    for item in ("b1", "b2"):
        q.push(item, "batch", "x", 1.0, 0.0, FAR)
    q.push("i1", "interactive", "y", 1.0, 0.0, FAR)
    assert q.pop(0.0).item == "i1"
    q.push("i2", "interactive", "x", 1.0, 0.0, FAR)  # arrives after b1, still goes first
    assert drain(q) == ["i2", "b1", "b2"]


def test_fair_order_within_each_tier():
    q = TieredQueue(TIERS, 10, 20)
    for item in ("A1", "A2", "B1", "B2"):
        q.push(item.lower(), "batch", item[0], 1.0, 0.0, FAR)
        q.push(item, "interactive", item[0], 1.0, 0.0, FAR)
    assert drain(q) == ["A1", "B1", "A2", "B2", "a1", "b1", "a2", "b2"]
    assert q.lengths() == {} and q.tier_lengths() == {"interactive": 0, "batch": 0}


def test_tenant_bound_is_per_tier_and_retry_counts_the_tiers_above():
    q = TieredQueue(TIERS, max_queue_per_tenant=2, max_queue_total=10, servers=2)
    q.observe_service(4.0)
    assert q.push("b1", "batch", "a", 1.0, 0.0, FAR) == Admit(2.0)  # (0 ahead + 1) * 4 / 2
    assert q.push("b2", "batch", "a", 1.0, 0.0, FAR) == Admit(4.0)
    # a's batch backlog does not block its interactive requests.
    assert q.push("i1", "interactive", "a", 1.0, 0.0, FAR) == Admit(2.0)
    assert q.push("i2", "interactive", "a", 1.0, 0.0, FAR) == Admit(4.0)
    assert q.push("i3", "interactive", "a", 1.0, 0.0, FAR) == Reject(ShedReason.TENANT_QUEUE_FULL, 2)
    # a's batch head has the two interactive requests ahead of it: (2 + 1) * 4 / 2.
    assert q.push("b3", "batch", "a", 1.0, 0.0, FAR) == Reject(ShedReason.TENANT_QUEUE_FULL, 6)
    assert (len(q), q.lengths(), q.tier_lengths()) == (4, {"a": 4}, {"interactive": 2, "batch": 2})


def test_zero_tenant_bound_queues_nothing():
    q = one_tier(max_queue_per_tenant=0, max_queue_total=0)
    assert q.push("a1", "only", "a", 1.0, 0.0, FAR) == Reject(ShedReason.TENANT_QUEUE_FULL, 1)


def test_extra_places_go_beyond_both_bounds_and_no_further():
    q = one_tier(max_queue_per_tenant=2, max_queue_total=3)
    q.push("a1", "only", "a", 1.0, 0.0, FAR)
    q.push("a2", "only", "a", 1.0, 0.0, FAR)
    assert isinstance(q.push("a3", "only", "a", 1.0, 0.0, FAR), Reject)  # a's bound
    assert isinstance(q.push("t1", "only", "a", 1.0, 0.0, FAR, extra=1), Admit)  # a turn's place beyond it
    assert q.push("t2", "only", "a", 1.0, 0.0, FAR, extra=1) == Reject(ShedReason.TENANT_QUEUE_FULL, 1)
    q.push("b1", "only", "b", 1.0, 0.0, FAR, extra=0)  # a full total: b (0+1) pushes out a's newest
    assert q.lengths() == {"a": 2, "b": 1} and "t1" not in q
    assert q.push("b2", "only", "b", 1.0, 0.0, FAR, extra=1) == Admit(0.0)  # beyond the total, nothing pushed
    assert len(q) == 4


def test_full_queue_pushes_out_the_longest_tenant_only():
    q = one_tier(max_queue_per_tenant=3, max_queue_total=3)
    for item in ("h1", "h2", "h3"):
        q.push(item, "only", "heavy", 1.0, 0.0, FAR)
    # light (0+1) < heavy 3: heavy's newest request makes room.
    assert q.push("l1", "only", "light", 1.0, 0.0, FAR) == Admit(0.0, ("h3",))
    # heavy (2+1) is not shorter than light 1: the arrival is rejected.
    assert q.push("h4", "only", "heavy", 1.0, 0.0, FAR) == Reject(ShedReason.QUEUE_FULL, 1)
    # light (1+1) is not strictly shorter than heavy 2 either.
    assert q.push("l2", "only", "light", 1.0, 0.0, FAR) == Reject(ShedReason.QUEUE_FULL, 1)
    assert q.lengths() == {"heavy": 2, "light": 1}
    assert drain(q) == ["h1", "l1", "h2"]


def test_interactive_displaces_the_longest_tenant_of_the_lowest_tier():
    q = TieredQueue(("interactive", "standard", "batch"), max_queue_per_tenant=5, max_queue_total=7)
    q.push("i1", "interactive", "a", 1.0, 0.0, FAR)
    q.push("s1", "standard", "a", 1.0, 0.0, FAR)
    for item in ("x1", "x2"):
        q.push(item, "batch", "x", 1.0, 0.0, FAR)  # 2 / 1
    for item in ("y1", "y2", "y3"):
        q.push(item, "batch", "y", 2.0, 0.0, FAR)  # 3 / 2 = 1.5
    # Priority wins outright: the longest batch tenant (x, 2 > 1.5) makes room.
    assert q.push("i2", "interactive", "a", 1.0, 0.0, FAR) == Admit(0.0, ("x2",))
    # A standard arrival also displaces from batch, never from interactive.
    assert q.push("s2", "standard", "a", 1.0, 0.0, FAR) == Admit(0.0, ("y3",))
    assert q.tier_lengths() == {"interactive": 2, "standard": 2, "batch": 3}
    # A batch arrival has no tier below: push-out within batch, where z (0+1)/1
    # is not strictly shorter than x 1/1 or y 2/2.
    assert q.push("z1", "batch", "z", 1.0, 0.0, FAR) == Reject(ShedReason.QUEUE_FULL, 1)
    assert q.push("i3", "interactive", "a", 1.0, 0.0, FAR) == Admit(0.0, ("x1",))  # x and y tie: x first


def test_a_full_queue_of_higher_tiers_rejects_a_batch_arrival():
    q = TieredQueue(TIERS, max_queue_per_tenant=2, max_queue_total=2)
    q.push("i1", "interactive", "a", 1.0, 0.0, FAR)
    q.push("i2", "interactive", "b", 1.0, 0.0, FAR)
    assert q.push("b1", "batch", "c", 1.0, 0.0, FAR) == Reject(ShedReason.QUEUE_FULL, 1)
    assert "b1" not in q and "i1" in q


def test_deadline_aware_early_rejection():
    q = one_tier(max_queue_per_tenant=10, max_queue_total=10, servers=1)
    q.observe_service(2.0)
    q.push("a1", "only", "a", 1.0, 0.0, FAR)
    q.push("a2", "only", "a", 1.0, 0.0, FAR)
    # a's next request has two ahead, one server, 2 s each: (2 + 1) * 2 = 6 s.
    assert q.push("a3", "only", "a", 1.0, 10.0, 15.0) == Reject(ShedReason.DEADLINE, 1)
    assert q.push("a3", "only", "a", 1.0, 10.0, 13.5) == Reject(ShedReason.DEADLINE, 3)  # 6 - 3.5
    # b's first request ties with a1's tag and goes after it only: (1 + 1) * 2 = 4 s.
    assert q.push("b1", "only", "b", 1.0, 10.0, 13.5) == Reject(ShedReason.DEADLINE, 1)
    assert q.push("b1", "only", "b", 1.0, 10.0, 14.0) == Admit(4.0)
    assert q.push("a3", "only", "a", 1.0, 10.0, 16.0) == Reject(ShedReason.DEADLINE, 2)  # now 3 ahead: 8 s
    assert q.push("a3", "only", "a", 1.0, 10.0, 18.0) == Admit(8.0)
    assert q.push("x", "only", "c", 1.0, 10.0, 10.0) == Reject(ShedReason.DEADLINE, 1)  # already due
    assert drain(q, 10.0) == ["a1", "b1", "a2", "a3"]


def test_deadline_counts_every_request_of_the_tiers_above():
    q = TieredQueue(TIERS, 10, 10, servers=2)
    q.observe_service(2.0)
    for i in range(3):
        q.push(f"i{i}", "interactive", "a", 1.0, 0.0, FAR)
    # A fresh batch tenant: 3 interactive ahead, (3 + 1) * 2 / 2 = 4 s.
    assert q.estimate_wait("batch", "b", 1.0) == 4.0
    assert q.push("b1", "batch", "b", 1.0, 0.0, 3.5) == Reject(ShedReason.DEADLINE, 1)
    assert q.push("b1", "batch", "b", 1.0, 0.0, 4.0) == Admit(4.0)
    # Lower tiers do not delay a higher one: a fresh interactive tenant waits 2 s.
    assert q.push("i9", "interactive", "c", 1.0, 0.0, 2.0) == Admit(2.0)


def test_no_early_rejection_before_any_service_is_observed():
    q = TieredQueue(TIERS, 100, 100)
    for i in range(50):
        assert isinstance(q.push(i, "batch", "a", 1.0, 0.0, 0.001), Admit)


def test_pop_and_expire_drop_expired_requests_of_every_tier():
    q = TieredQueue(TIERS, 10, 10)
    q.push("i1", "interactive", "a", 1.0, 0.0, 5.0)
    q.push("b1", "batch", "a", 1.0, 0.0, 5.0)
    q.push("b2", "batch", "a", 1.0, 0.0, 100.0)
    assert q.pop(10.0) == Popped("b2", ("i1", "b1"))
    q.push("b3", "batch", "a", 1.0, 10.0, 20.0)
    q.push("i2", "interactive", "a", 1.0, 10.0, 20.0)
    assert q.expire(20.0) == ["i2", "b3"]  # tier by tier, highest first
    assert q.pop(20.0) == Popped(None, ())


def test_remove_finds_the_item_in_any_tier():
    q = TieredQueue(TIERS, 10, 10)
    q.push("b1", "batch", "a", 1.0, 0.0, FAR)
    assert "b1" in q and q.remove("b1") and not q.remove("b1")
    assert len(q) == 0


def test_unknown_tier_and_duplicate_items_raise():
    q = TieredQueue(TIERS, 10, 10)
    with pytest.raises(ValueError, match="unknown priority tier 'gold'"):
        q.push("x", "gold", "a", 1.0, 0.0, FAR)
    q.push("x", "batch", "a", 1.0, 0.0, FAR)
    with pytest.raises(ValueError, match="already queued"):
        q.push("x", "interactive", "a", 1.0, 0.0, FAR)
    with pytest.raises(ValueError):
        TieredQueue(("a", "a"), 1, 1)


def test_service_time_ewma_and_retry_after_clamp():
    q = one_tier(max_queue_per_tenant=10, max_queue_total=10, ewma_alpha=0.5, max_retry_after_s=60)
    assert q.service_time_s is None
    q.observe_service(2.0)
    q.observe_service(4.0)
    assert q.service_time_s == 3.0
    assert (q.retry_after(0.0), q.retry_after(1.2), q.retry_after(1e6), q.retry_after(math.inf)) == (1, 2, 60, 60)
    q.servers = 0
    assert q.estimate_wait("only", "a", 1.0) == math.inf
