import math

from deployments.admission import Admit, FairQueue, Popped, Reject, ShedReason

FAR = 1e9  # a deadline that never matters


def drain(q: FairQueue, now: float = 0.0) -> list:
    out = []
    while (p := q.pop(now)).item is not None:
        out.append(p.item)
    return out


def test_fifo_within_a_tenant():
    q = FairQueue(10, 10)
    for item in ("a1", "a2", "a3"):
        assert isinstance(q.push(item, "a", 1.0, 0.0, FAR), Admit)
    assert drain(q) == ["a1", "a2", "a3"]
    assert q.pop(0.0) == Popped(None, ())


def test_weights_2_to_1_exact_sequence():
    q = FairQueue(10, 20)
    # Finish tags: A (w=2) 0.5, 1, 1.5, 2; B (w=1) 1, 2, 3. Ties go to the earlier push.
    for item in ("A1", "B1", "A2", "B2", "A3", "B3", "A4"):
        q.push(item, item[0], 2.0 if item[0] == "A" else 1.0, 0.0, FAR)
    assert drain(q) == ["A1", "B1", "A2", "A3", "B2", "A4", "B3"]


def test_backlogged_weights_2_to_1_share_pops_2_to_1():
    q = FairQueue(100, 200)
    for i in range(30):
        q.push(f"A{i}", "A", 2.0, 0.0, FAR)
        q.push(f"B{i}", "B", 1.0, 0.0, FAR)
    first = [q.pop(0.0).item[0] for _ in range(30)]
    assert (first.count("A"), first.count("B")) == (20, 10)


def test_idle_tenant_earns_no_credit():
    q = FairQueue(10, 20)
    for i in range(5):  # A alone: the virtual time moves to 5
        q.push(f"a{i}", "a", 1.0, 0.0, FAR)
        assert q.pop(0.0).item == f"a{i}"
    for i in (5, 6, 7):
        q.push(f"a{i}", "a", 1.0, 0.0, FAR)
    for i in (1, 2, 3):
        q.push(f"b{i}", "b", 1.0, 0.0, FAR)
    assert drain(q) == ["a5", "b1", "a6", "b2", "a7", "b3"]


def test_tenant_bound_rejects_with_retry_after():
    q = FairQueue(max_queue_per_tenant=2, max_queue_total=10, servers=2)
    q.observe_service(4.0)
    assert q.push("a1", "a", 1.0, 0.0, FAR) == Admit(2.0)  # (0 ahead + 1) * 4 / 2
    assert q.push("a2", "a", 1.0, 0.0, FAR) == Admit(4.0)
    # The head leaves the queue in 2 s: that is when a slot frees.
    assert q.push("a3", "a", 1.0, 0.0, FAR) == Reject(ShedReason.TENANT_QUEUE_FULL, 2)
    assert len(q) == 2 and "a3" not in q


def test_zero_tenant_bound_queues_nothing():
    q = FairQueue(max_queue_per_tenant=0, max_queue_total=0)
    assert q.push("a1", "a", 1.0, 0.0, FAR) == Reject(ShedReason.TENANT_QUEUE_FULL, 1)


def test_full_queue_pushes_out_the_longest_tenant_only():
    q = FairQueue(max_queue_per_tenant=3, max_queue_total=3)
    for item in ("h1", "h2", "h3"):
        q.push(item, "heavy", 1.0, 0.0, FAR)
    # light (0+1) < heavy 3: heavy's newest request makes room.
    assert q.push("l1", "light", 1.0, 0.0, FAR) == Admit(0.0, ("h3",))
    # heavy (2+1) is not shorter than light 1: the arrival is rejected.
    assert q.push("h4", "heavy", 1.0, 0.0, FAR) == Reject(ShedReason.QUEUE_FULL, 1)
    # light (1+1) is not strictly shorter than heavy 2 either.
    assert q.push("l2", "light", 1.0, 0.0, FAR) == Reject(ShedReason.QUEUE_FULL, 1)
    assert q.lengths() == {"heavy": 2, "light": 1}
    assert drain(q) == ["h1", "l1", "h2"]


def test_deadline_aware_early_rejection():
    q = FairQueue(10, 10, servers=1)
    q.observe_service(2.0)
    q.push("a1", "a", 1.0, 0.0, FAR)
    q.push("a2", "a", 1.0, 0.0, FAR)
    # a's next request has two ahead, one server, 2 s each: (2 + 1) * 2 = 6 s.
    assert q.push("a3", "a", 1.0, 10.0, 15.0) == Reject(ShedReason.DEADLINE, 1)
    assert q.push("a3", "a", 1.0, 10.0, 13.5) == Reject(ShedReason.DEADLINE, 3)  # 6 - 3.5
    # b's first request ties with a1's tag and goes after it only: (1 + 1) * 2 = 4 s.
    assert q.push("b1", "b", 1.0, 10.0, 13.5) == Reject(ShedReason.DEADLINE, 1)
    assert q.push("b1", "b", 1.0, 10.0, 14.0) == Admit(4.0)
    assert q.push("a3", "a", 1.0, 10.0, 16.0) == Reject(ShedReason.DEADLINE, 2)  # now 3 ahead: 8 s
    assert q.push("a3", "a", 1.0, 10.0, 18.0) == Admit(8.0)
    assert q.push("x", "c", 1.0, 10.0, 10.0) == Reject(ShedReason.DEADLINE, 1)  # already due
    assert drain(q, 10.0) == ["a1", "b1", "a2", "a3"]


def test_no_early_rejection_before_any_service_is_observed():
    q = FairQueue(100, 100)
    for i in range(50):
        assert isinstance(q.push(i, "a", 1.0, 0.0, 0.001), Admit)


def test_expired_while_queued_is_returned_by_pop_and_expire():
    q = FairQueue(10, 10)
    q.push("a1", "a", 1.0, 0.0, 10.0)
    q.push("a2", "a", 1.0, 0.0, 100.0)
    q.push("b1", "b", 1.0, 0.0, 5.0)
    q.push("b2", "b", 1.0, 0.0, 100.0)
    # Tags a1 = b1 = 1, a2 = b2 = 2. a1 is the head and is dropped; a2 takes
    # its tag and wins the tie with b1, which stays queued until looked at.
    assert q.pop(20.0) == Popped("a2", ("a1",))
    q.push("c1", "c", 1.0, 20.0, 30.0)
    assert q.expire(20.0) == ["b1"]
    assert q.expire(29.0) == []
    assert q.expire(30.0) == ["c1"]
    assert drain(q, 30.0) == ["b2"]


def test_removing_an_unserved_item_retags_the_tenant():
    q = FairQueue(10, 10)
    for item in ("a1", "a2", "a3"):
        q.push(item, "a", 1.0, 0.0, FAR)
    q.push("b1", "b", 1.0, 0.0, FAR)
    assert q.remove("a1") and not q.remove("a1")
    # a2 inherits a1's tag (1) and wins the tie with b1 by push order.
    assert drain(q) == ["a2", "b1", "a3"]


def test_service_time_ewma_and_retry_after_clamp():
    q = FairQueue(10, 10, ewma_alpha=0.5, max_retry_after_s=60)
    assert q.service_time_s is None
    q.observe_service(2.0)
    q.observe_service(4.0)
    assert q.service_time_s == 3.0
    assert (q.retry_after(0.0), q.retry_after(1.2), q.retry_after(1e6), q.retry_after(math.inf)) == (1, 2, 60, 60)
    q.servers = 0
    assert q.estimate_wait("a", 1.0) == math.inf
