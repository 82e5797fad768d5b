from deployments.admission import FairQueue, Popped

FAR = 1e9  # a deadline that never matters


def drain(q: FairQueue, now: float = 0.0) -> list:
    out = []
    while (p := q.pop(now)).item is not None:
        out.append(p.item)
    return out


def test_fifo_within_a_tenant():
    q = FairQueue()
    for item in ("a1", "a2", "a3"):
        q.push(item, "a", 1.0, FAR)
    assert drain(q) == ["a1", "a2", "a3"]
    assert q.pop(0.0) == Popped(None, ())


def test_weights_2_to_1_exact_sequence():
    q = FairQueue()
    # Finish tags: A (w=2) 0.5, 1, 1.5, 2; B (w=1) 1, 2, 3. Ties go to the earlier push.
    for item in ("A1", "B1", "A2", "B2", "A3", "B3", "A4"):
        q.push(item, item[0], 2.0 if item[0] == "A" else 1.0, FAR)
    assert drain(q) == ["A1", "B1", "A2", "A3", "B2", "A4", "B3"]


def test_backlogged_weights_2_to_1_share_pops_2_to_1():
    q = FairQueue()
    for i in range(30):
        q.push(f"A{i}", "A", 2.0, FAR)
        q.push(f"B{i}", "B", 1.0, FAR)
    first = [q.pop(0.0).item[0] for _ in range(30)]
    assert (first.count("A"), first.count("B")) == (20, 10)


def test_idle_tenant_earns_no_credit():
    q = FairQueue()
    for i in range(5):  # A alone: the virtual time moves to 5
        q.push(f"a{i}", "a", 1.0, FAR)
        assert q.pop(0.0).item == f"a{i}"
    for i in (5, 6, 7):
        q.push(f"a{i}", "a", 1.0, FAR)
    for i in (1, 2, 3):
        q.push(f"b{i}", "b", 1.0, FAR)
    assert drain(q) == ["a5", "b1", "a6", "b2", "a7", "b3"]


def test_ahead_counts_follow_the_tags():
    q = FairQueue()
    for item in ("a1", "a2", "a3"):
        q.push(item, "a", 1.0, FAR)
    q.push("b1", "b", 2.0, FAR)  # tag 0.5: served first
    # A new b request gets tag 1.0: b1 and a1 (tag 1.0, pushed earlier) are ahead.
    assert q.ahead_of_new("b", 2.0) == 2
    assert q.ahead_of_new("b", 2.0, without="a1") == 1
    assert q.ahead_of_new("b", 2.0, without="a3") == 2  # a3 (tag 3) is behind anyway
    assert q.ahead_of_new("c", 1.0) == 2  # tag 1.0 ties a1, which was pushed first
    assert (q.ahead_of_head("a"), q.ahead_of_head("b"), q.ahead_of_head("c")) == (1, 0, 0)
    assert (q.tenant_len("a"), q.lengths()) == (3, {"a": 3, "b": 1})


def test_longest_is_the_newest_of_the_heaviest_weighted_queue():
    q = FairQueue()
    for item in ("a1", "a2", "a3"):
        q.push(item, "a", 2.0, FAR)  # 3 / 2 = 1.5
    for item in ("b1", "b2"):
        q.push(item, "b", 1.0, FAR)  # 2 / 1 = 2
    assert q.longest() == ("b2", 2.0)
    assert q.longest(exclude="b") == ("a3", 1.5)
    assert FairQueue().longest() is None


def test_expired_while_queued_is_returned_by_pop_and_expire():
    q = FairQueue()
    q.push("a1", "a", 1.0, 10.0)
    q.push("a2", "a", 1.0, 100.0)
    q.push("b1", "b", 1.0, 5.0)
    q.push("b2", "b", 1.0, 100.0)
    # Tags a1 = b1 = 1, a2 = b2 = 2. a1 is the head and is dropped; a2 takes
    # its tag and wins the tie with b1, which stays queued until looked at.
    assert q.pop(20.0) == Popped("a2", ("a1",))
    q.push("c1", "c", 1.0, 30.0)
    assert q.expire(20.0) == ["b1"]
    assert q.expire(29.0) == []
    assert q.expire(30.0) == ["c1"]
    assert drain(q, 30.0) == ["b2"]


def test_removing_an_unserved_item_retags_the_tenant():
    q = FairQueue()
    for item in ("a1", "a2", "a3"):
        q.push(item, "a", 1.0, FAR)
    q.push("b1", "b", 1.0, FAR)
    assert q.remove("a1") and not q.remove("a1")
    # a2 inherits a1's tag (1) and wins the tie with b1 by push order.
    assert drain(q) == ["a2", "b1", "a3"]
