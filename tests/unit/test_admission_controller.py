from deployments.admission import Admission, AdmissionConfig, ShedReason, TicketState


def cfg(**kw) -> AdmissionConfig:
    base = dict(capacity_per_replica=1, max_queue_per_tenant=10, max_queue_total=20,
                default_deadline_s=100.0)
    base.update(kw)
    return AdmissionConfig(**base)


def test_admit_queue_and_handoff_on_release():
    adm = Admission(cfg(capacity_per_replica=2))
    t1, t2, t3 = (adm.submit("a", None, 0.0) for _ in range(3))
    assert [t.state for t in (t1, t2, t3)] == [TicketState.ADMITTED] * 2 + [TicketState.QUEUED]
    handoff = adm.release(t1, 1.5)
    assert handoff.admitted == [t3] and handoff.shed == []
    assert (t1.state, t3.state, t3.queue_time_s) == (TicketState.RELEASED, TicketState.ADMITTED, 1.5)
    assert adm.queue.service_time_s == 1.5
    st = adm.stats["a"]
    assert (st.submitted, st.admitted, st.admitted_immediately, st.queued, st.completed) == (3, 3, 2, 1, 1)
    assert (st.queue_time_sum_s, st.queue_time_count, st.queue_time_max_s) == (1.5, 3, 1.5)


def test_release_is_idempotent_and_cancels_queued():
    adm = Admission(cfg())
    t1 = adm.submit("a", None, 0.0)
    t2 = adm.submit("a", None, 0.0)
    t3 = adm.submit("b", None, 0.0)
    assert not adm.release(t2, 0.5)  # queued: cancelled, frees nothing
    assert t2.state is TicketState.CANCELLED and len(adm.queue) == 1
    assert adm.release(t1, 1.0).admitted == [t3]
    assert not adm.release(t1, 2.0) and not adm.release(t2, 2.0)
    assert adm.permits.in_use == 1 and adm.stats["a"].completed == 1


def test_heavy_tenant_cannot_jump_light_tenant():
    adm = Admission(cfg())
    h = [adm.submit("heavy", None, 0.0) for _ in range(4)]  # h0 admitted, h1..h3 queued
    light = adm.submit("light", None, 0.0)
    order, current = [], h[0]
    for i in range(4):
        (current,) = adm.release(current, float(i + 1)).admitted
        order.append(current)
    assert order == [h[1], light, h[2], h[3]]


def test_tenant_weights_order_admissions():
    adm = Admission(cfg(tenant_weights={"g": 2.0}))
    first = adm.submit("f", None, 0.0)
    g = [adm.submit("g", None, 0.0) for _ in range(4)]
    f = [adm.submit("f", None, 0.0) for _ in range(2)]
    order, current = [], first
    for i in range(6):
        (current,) = adm.release(current, float(i + 1)).admitted
        order.append(current)
    assert order == [g[0], g[1], f[0], g[2], g[3], f[1]]


def test_expired_while_queued_is_shed_with_retry_after():
    adm = Admission(cfg(default_deadline_s=5.0))
    t1 = adm.submit("a", None, 0.0)
    t2 = adm.submit("b", None, 1.0)  # deadline 6.0
    t3 = adm.submit("b", None, 2.0, deadline_s=100.0)
    assert adm.expire(5.9) == []
    assert adm.expire(6.0) == [t2]
    assert (t2.state, t2.reason) == (TicketState.SHED, ShedReason.EXPIRED) and t2.retry_after_s >= 1
    assert adm.release(t1, 7.0).admitted == [t3]
    assert adm.stats["b"].shed == {ShedReason.EXPIRED: 1}


def test_release_skips_expired_and_reports_them():
    adm = Admission(cfg())
    t1 = adm.submit("a", None, 0.0)
    t2 = adm.submit("a", None, 0.0, deadline_s=1.0)
    t3 = adm.submit("a", None, 0.0, deadline_s=10.0)
    handoff = adm.release(t1, 2.0)
    assert handoff.admitted == [t3] and handoff.shed == [t2]
    assert t2.reason is ShedReason.EXPIRED


def test_bounded_queue_and_non_positive_deadline_are_shed_429_style():
    adm = Admission(cfg(max_queue_per_tenant=1, max_queue_total=1))
    adm.submit("a", None, 0.0)
    adm.submit("a", None, 0.0)
    full = adm.submit("a", None, 0.0)
    assert (full.state, full.reason, full.retry_after_s) == (TicketState.SHED, ShedReason.TENANT_QUEUE_FULL, 1)
    late = adm.submit("b", None, 0.0, deadline_s=0.0)
    assert (late.reason, late.retry_after_s) == (ShedReason.DEADLINE, 1)


def test_displaced_tickets_come_back_on_the_submitted_ticket():
    adm = Admission(cfg(max_queue_per_tenant=2, max_queue_total=2))
    adm.submit("heavy", None, 0.0)
    h1, h2 = adm.submit("heavy", None, 0.0), adm.submit("heavy", None, 0.0)
    light = adm.submit("light", None, 0.0)
    assert light.state is TicketState.QUEUED and light.displaced == [h2]
    assert (h2.state, h2.reason) == (TicketState.SHED, ShedReason.DISPLACED) and h2.retry_after_s >= 1
    assert h1.state is TicketState.QUEUED


def test_set_capacity_hands_new_permits_to_the_queue():
    adm = Admission(cfg(capacity_per_replica=2), replicas=1)
    ts = [adm.submit("a", None, 0.0) for _ in range(5)]
    assert adm.set_capacity(4, 1.0).admitted == ts[2:4]
    assert adm.queue.servers == 4 and adm.permits.in_use == 4
    assert not adm.set_capacity(2, 2.0)  # shrink: nobody loses a permit
    assert adm.permits.in_use == 4 and adm.permits.free == 0
    assert adm.release(ts[0], 3.0).admitted == []  # 3 in use, capacity 2
    assert adm.release(ts[1], 3.0).admitted == []  # 2 in use
    assert adm.release(ts[2], 3.0).admitted == [ts[4]]


def test_snapshot_reports_gauges_and_counters():
    adm = Admission(cfg())
    adm.submit("a", None, 0.0)
    adm.submit("a", None, 0.0)
    adm.submit("b", None, 0.0, deadline_s=-1.0)
    snap = adm.snapshot()
    assert (snap.capacity, snap.permits_in_use, snap.queue_len, snap.service_time_s) == (1, 1, 1, None)
    assert snap.tier_queue_len == {"interactive": 1, "batch": 0}
    assert (snap.tenants["a"].in_use, snap.tenants["a"].queue_len) == (1, 1)
    assert snap.tenants["b"].stats.shed == {ShedReason.DEADLINE: 1}
    assert snap.tenants["b"].stats.shed_total == 1
    snap.tenants["b"].stats.shed.clear()  # a copy
    assert adm.stats["b"].shed_total == 1


def test_the_start_time_comes_off_the_deadline_so_a_late_request_is_refused_at_once():
    adm = Admission(cfg())
    holder = adm.submit("a", None, 0.0)
    adm.observe_start(1.0)  # start 1.0 s, deviation 0.5 s: margin 1.0 + 4 * 0.5
    assert adm.start_margin_s == 3.0
    late = adm.submit("b", None, 0.0, deadline_s=2.9)  # cannot see a token within 2.9 s
    assert late.state is TicketState.SHED and late.reason is ShedReason.DEADLINE
    ok = adm.submit("b", None, 0.0, deadline_s=5.0)  # 2 s of queueing left
    assert ok.state is TicketState.QUEUED and ok.deadline == 2.0
    adm.observe_start(2.0)  # EWMA: 1.0 + 0.2 * (2.0 - 1.0); deviation 0.5 + 0.2 * (1.0 - 0.5)
    assert abs(adm.start_time_s - 1.2) < 1e-9 and abs(adm.start_margin_s - 3.6) < 1e-9
    adm.release(holder, 0.1)
    assert ok.state is TicketState.ADMITTED
    fresh = Admission(cfg())
    fresh.observe_start(1.0)
    assert fresh.submit("c", None, 0.0, deadline_s=0.5).admitted  # a free permit is still its best chance


def test_unset_capacity_follows_a_gpu_engines_limit_and_stays_small_on_cpu():
    from common.config.admission import CPU_CAPACITY

    unset = AdmissionConfig()
    assert unset.capacity_per_replica is None and unset.capacity == CPU_CAPACITY
    assert unset.resolved(1024).capacity == 1024  # an H100's vLLM default
    assert unset.resolved(None).capacity == CPU_CAPACITY  # a CPU engine
    assert AdmissionConfig(capacity_per_replica=8).resolved(1024).capacity == 8  # what the config says wins
    assert Admission(unset.resolved(256), replicas=2).permits.capacity == 512
