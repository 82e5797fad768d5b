"""The site policy as a pure unit (time passed in, seeded RNG): local first, session stickiness,
the hot rule, capacity-weighted spill, wait locally vs the round trip, backoff, the near set
and expiry; and the two baselines."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from routing.sites.latency_map import LatencyMap
from routing.sites.site_baselines import LocalOnly, NearestOnly
from routing.sites.site_select import SiteDecision, SiteSelectConfig, SiteSelector, SiteView

MS = 0.001


def lmap(rtts_ms: dict[str, float], origin: str = "o", now: float = 0.0, ttl_s: float = 30.0) -> LatencyMap:
    m = LatencyMap(ttl_s)
    for name, r in rtts_ms.items():
        m.observe(origin, name, r * MS, now)
    return m


def view(name: str, free: int, total: int = 10, wait: float = 0.0, alive: bool = True,
         avg: float | None = None) -> SiteView:
    return SiteView(name, free, total, wait, alive, avg)


def views(*vs: SiteView) -> dict[str, SiteView]:
    return {v.name: v for v in vs}


def selector(seed: int = 0, **cfg) -> SiteSelector:
    return SiteSelector(SiteSelectConfig(**cfg), random.Random(seed))


FULL = dict(free=0, wait=5.0)  # no permit and a queue longer than max_queue_wait_s (2 s)


def test_local_serves_while_it_has_a_permit_and_is_not_hot():
    v = views(view("o", 5), view("a", 10))
    assert selector().choose("o", v, lmap({"a": 4}), 0.0) == SiteDecision("o", "local", 0.0)
    # busy 0.9 but its only neighbour is as busy: nowhere cooler, stays local
    v = views(view("o", 1), view("a", 1))
    assert selector().choose("o", v, lmap({"a": 4}), 0.0).reason == "local"


def test_hot_site_spills_to_a_cooler_neighbour():
    lat = lmap({"a": 4, "b": 5})
    v = views(view("o", 2), view("a", 9), view("b", 2))  # o 0.8 busy, a 0.1, b 0.8
    d = selector().choose("o", v, lat, 0.0)
    assert d == SiteDecision("a", "spill", pytest.approx(4 * MS))
    # at 0.6 busy (spill_busy) it keeps the request even though a is cooler
    v = views(view("o", 4), view("a", 9))
    assert selector().choose("o", v, lat, 0.0).reason == "local"
    # a neighbour only 4 points cooler is not cooler enough (balance_margin 0.05)
    v = views(view("o", 20, 100), view("a", 24, 100))
    assert selector().choose("o", v, lmap({"a": 4}), 0.0).reason == "local"


def test_a_small_site_spills_from_where_its_requests_would_queue():
    lat = lmap({"a": 4})
    cfg = SiteSelectConfig()
    assert cfg.spill_point(2) == pytest.approx(0.469, abs=0.002)  # Erlang C(2) reaches 0.3 there
    assert cfg.spill_point(10) == cfg.spill_point(32) == 0.6  # large sites: spill_busy
    # 2 permits, averaged 0.52 busy (under spill_busy): already hot against an idle neighbour
    v = views(view("o", 1, 2, avg=0.52), view("a", 2, 2, avg=0.1))
    assert selector().choose("o", v, lat, 0.0).site == "a"
    # the same load on a 10-permit site is not hot
    v = views(view("o", 5, 10, avg=0.52), view("a", 10, 10, avg=0.1))
    assert selector().choose("o", v, lat, 0.0).reason == "local"
    with pytest.raises(ValueError):
        SiteSelectConfig(spill_wait_chance=1.0)


def test_hot_rule_reads_the_averaged_load_when_reported():
    lat = lmap({"a": 4})
    # momentarily 0.9 busy, but averaged 0.4: not hot
    v = views(view("o", 1, avg=0.4), view("a", 9, avg=0.1))
    assert selector().choose("o", v, lat, 0.0).reason == "local"
    # momentarily idle, but averaged 0.9 busy (its sessions are thinking): hot
    v = views(view("o", 10, avg=0.9), view("a", 5, avg=0.5))
    assert selector().choose("o", v, lat, 0.0).site == "a"


def test_spill_weights_follow_free_capacity():
    lat = lmap({"a": 4, "b": 5, "c": 6})
    v = views(view("o", **FULL), view("a", 30, 40), view("b", 10, 40), view("c", 0, 40))
    sel = selector(seed=7)
    n = Counter(sel.choose("o", v, lat, 0.0).site for _ in range(4000))
    assert n["c"] == 0 and set(n) == {"a", "b"}
    assert 2.6 < n["a"] / n["b"] < 3.4  # 30:10
    assert all(sel.choose("o", v, lat, 0.0).reason == "spill" for _ in range(10))


def test_queue_wait_discounts_the_weight():
    lat = lmap({"a": 4, "b": 5})
    v = views(view("o", **FULL), view("a", 10, wait=1.0), view("b", 10))  # a's weight halves
    sel = selector(seed=3)
    n = Counter(sel.choose("o", v, lat, 0.0).site for _ in range(3000))
    assert 1.7 < n["b"] / n["a"] < 2.3


def test_wait_locally_when_the_round_trip_costs_more():
    v = views(view("o", 0, wait=0.05), view("a", 10))
    assert selector().choose("o", v, lmap({"a": 20}), 0.0) == SiteDecision("a", "spill", pytest.approx(0.02))
    assert selector().choose("o", v, lmap({"a": 60}), 0.0) == SiteDecision("o", "wait_local", 0.0)
    # forward_overhead_s counts against the trip: 20 ms + 40 ms overhead > 50 ms
    assert selector(forward_overhead_s=0.04).choose("o", v, lmap({"a": 20}), 0.0).reason == "wait_local"
    # the local queue would refuse it (wait beyond max_queue_wait_s): any trip beats that
    v = views(view("o", 0, wait=3.0), view("a", 10))
    assert selector().choose("o", v, lmap({"a": 70}), 0.0).site == "a"


def test_full_everywhere_queues_remotely_then_rejects():
    lat = lmap({"a": 4, "b": 5})
    v = views(view("o", **FULL), view("a", 0, wait=1.5), view("b", 0, wait=0.5))
    assert selector().choose("o", v, lat, 0.0) == SiteDecision("b", "queue_remote", pytest.approx(5 * MS))
    v = views(view("o", **FULL), view("a", **FULL), view("b", **FULL))
    assert selector().choose("o", v, lat, 0.0) == SiteDecision(None, "rejected", 0.0)


def test_a_site_whose_queue_is_full_for_the_tenant_cannot_queue_it():
    # b has no permit free and names tenant t as queue-full: t's request must not queue there
    b = SiteView("b", 0, 10, 0.5, queue_full_for=frozenset({"t"}))
    assert b.for_tenant("u") is b and b.for_tenant(None) is b
    assert b.for_tenant("t").queue_wait_s == float("inf")
    freed = SiteView("b", 1, 10, 0.0, queue_full_for=frozenset({"t"}))
    assert freed.for_tenant("t") is freed  # a free permit admits it whatever the queue
    o = view("o", **FULL)
    near = lmap({"b": 4})
    assert selector().choose("o", views(o, b.for_tenant("u")), near, 0.0).site == "b"
    assert selector().choose("o", views(o, b.for_tenant("t")), near, 0.0) == SiteDecision(None, "rejected")


def test_session_stays_on_its_site_while_it_can_serve():
    lat = lmap({"a": 4, "b": 5})
    v = views(view("o", 10), view("a", 1), view("b", 10))
    assert selector().choose("o", v, lat, 0.0, session_site="a") == SiteDecision("a", "session", pytest.approx(4 * MS))
    v = views(view("o", 10), view("a", 0, wait=1.0), view("b", 10))  # full but the queue admits
    assert selector().choose("o", v, lat, 0.0, session_site="a").reason == "session"
    # full as its view (a probe old) says: still worth the round trip for the prefix
    v = views(view("o", 10), view("a", **FULL), view("b", 10))
    assert selector().choose("o", v, lat, 0.0, session_site="a") == SiteDecision("a", "session", pytest.approx(4 * MS))
    # ... but the origin's own view is exact: a full origin moves its session's turn
    v = views(view("o", **FULL), view("a", 10))
    assert selector().choose("o", v, lat, 0.0, session_site="o").site == "a"
    v = views(view("o", 10), view("a", 5, alive=False), view("b", 10))
    assert selector().choose("o", v, lat, 0.0, session_site="a").site == "o"
    # its site is unknown to the map (expired): not reachable, moves
    assert selector().choose("o", views(view("o", 10), view("a", 5)), lmap({"b": 5}), 0.0, "a").site == "o"


def test_session_on_a_hot_origin_is_not_moved_for_balance():
    v = views(view("o", 1), view("a", 10))
    assert selector().choose("o", v, lmap({"a": 4}), 0.0, session_site="o").reason == "session"


def test_backoff_skips_a_refusing_site_doubles_caps_and_clears():
    lat = lmap({"a": 4, "b": 50})
    v = views(view("o", **FULL), view("a", 10), view("b", 10))
    sel = selector(backoff_base_s=1.0, backoff_max_s=3.0, near_slack_s=0.1)
    sel.refused("a", now=0.0)
    assert sel.choose("o", v, lat, 0.5).site == "b"
    # a session's site in backoff: left while its view predates the refusal ...
    assert sel.choose("o", v, lat, 0.5, session_site="a").site == "b"
    # ... tried again (its prefix is there) once a view heard since shows a free permit ...
    fresh = {**v, "a": SiteView("a", 10, 10, as_of=0.2)}
    assert sel.choose("o", fresh, lat, 0.5, session_site="a") == SiteDecision("a", "session", pytest.approx(4 * MS))
    # ... but not when that view offers only its queue
    fresh = {**v, "a": SiteView("a", 0, 10, queue_wait_s=1.0, as_of=0.2)}
    assert sel.choose("o", fresh, lat, 0.5, session_site="a").site == "b"
    assert not sel.backoff.active("a", 1.0)
    assert "a" in {sel.choose("o", v, lat, 1.0).site for _ in range(20)}
    sel.refused("a", now=1.0)  # 2 s
    assert sel.backoff.active("a", 2.9) and not sel.backoff.active("a", 3.0)
    sel.refused("a", now=3.0)  # 4 s, capped at 3
    assert sel.backoff.active("a", 5.9) and not sel.backoff.active("a", 6.0)
    sel.refused("a", now=6.0)
    sel.served("a", now=6.5)
    assert not sel.backoff.active("a", 6.5)
    sel.refused("a", now=7.0)  # count was reset: 1 s again
    assert not sel.backoff.active("a", 8.0)


def test_near_set_is_the_k_nearest_within_the_slack_and_the_cap():
    lat = lmap({"a": 4, "b": 5, "c": 13, "d": 15, "e": 6})
    v = views(view("o", 10), *(view(n, 10) for n in "abcde"))
    sel = selector(near_k=3, near_slack_s=0.010)
    assert [n for n, _ in sel.near("o", v, lat, 0.0)] == ["a", "b", "e"]
    assert [n for n, _ in selector(near_k=8).near("o", v, lat, 0.0)] == ["a", "b", "e", "c"]
    assert [n for n, _ in selector(near_max_rtt_s=0.0045).near("o", v, lat, 0.0)] == ["a"]
    # dead in the views, or missing from them: not near
    v["b"] = view("b", 10, alive=False)
    del v["e"]
    assert [n for n, _ in selector().near("o", v, lat, 0.0)] == ["a", "c"]


def test_beyond_the_near_set_only_when_no_near_site_can_take_it():
    # near set: a and b (within 10 ms of the nearest); c at 25 ms and d at 40 ms are beyond it, e past the cap
    lat = lmap({"a": 5, "b": 7, "c": 25, "d": 40, "e": 90})
    far = (view("c", 2), view("d", 6), view("e", 10))
    v = views(view("o", **FULL), view("a", 0, wait=1.0), view("b", **FULL), *far)
    assert selector().choose("o", v, lat, 0.0).reason == "queue_remote"  # a near queue first
    v = views(view("o", **FULL), view("a", **FULL), view("b", **FULL), *far)
    sel = selector(seed=1)
    n = Counter(sel.choose("o", v, lat, 0.0).site for _ in range(2000))
    assert set(n) == {"c", "d"} and 2.4 < n["d"] / n["c"] < 3.6  # drawn by free permits, never past 80 ms
    assert sel.choose("o", v, lat, 0.0).reason == "far"
    # no free permit out there: the far queue with the least rtt + wait; none: rejected
    v.update(views(view("c", 0, wait=1.9), view("d", 0, wait=0.5)))
    assert selector().choose("o", v, lat, 0.0) == SiteDecision("d", "far", pytest.approx(0.04))
    v.update(views(view("c", **FULL), view("d", **FULL)))
    assert selector().choose("o", v, lat, 0.0) == SiteDecision(None, "rejected", 0.0)


def test_a_site_whose_probes_expired_is_never_chosen():
    lat = LatencyMap(ttl_s=10)
    lat.observe("o", "a", 0.004, 0.0)
    lat.observe("o", "b", 0.006, 0.0)
    lat.observe("o", "b", 0.006, 8.0)  # a stops answering after t=0
    v = views(view("o", **FULL), view("a", 10), view("b", 1))
    sel = selector()
    assert {sel.choose("o", v, lat, 5.0).site for _ in range(50)} == {"a", "b"}
    assert {sel.choose("o", v, lat, 11.0).site for _ in range(50)} == {"b"}


def test_dead_origin_spills():
    v = views(view("o", 10, alive=False), view("a", 3))
    assert selector().choose("o", v, lmap({"a": 4}), 0.0).site == "a"


def test_config_is_validated():
    for bad in (dict(near_k=0), dict(spill_busy=1.5), dict(balance_margin=-0.1), dict(wait_scale_s=0),
                dict(backoff_base_s=5, backoff_max_s=1), dict(max_queue_wait_s=-1)):
        with pytest.raises(ValueError):
            SiteSelectConfig(**bad)
    with pytest.raises(ValueError):
        SiteView("x", 5, 4)
    with pytest.raises(ValueError):
        SiteView("x", 1, 4, busy_avg=1.5)


def test_local_only_rejects_when_the_local_site_cannot_take_it():
    lat = lmap({"a": 4})
    assert LocalOnly().choose("o", views(view("o", 1), view("a", 10)), lat, 0.0).site == "o"
    assert LocalOnly().choose("o", views(view("o", 0, wait=1.0)), lat, 0.0).site == "o"
    assert LocalOnly().choose("o", views(view("o", **FULL), view("a", 10)), lat, 0.0) == SiteDecision(
        None, "rejected", 0.0)


def test_nearest_only_tries_only_the_single_nearest_live_neighbour():
    lat = lmap({"a": 4, "b": 5, "c": 6})
    v = views(view("o", **FULL), view("a", **FULL), view("b", 10), view("c", 10))
    assert NearestOnly().choose("o", v, lat, 0.0) == SiteDecision(None, "rejected", 0.0)
    assert selector().choose("o", v, lat, 0.0).site in ("b", "c")  # random-near finds room
    v["a"] = view("a", 2)
    assert NearestOnly().choose("o", v, lat, 0.0) == SiteDecision("a", "nearest", pytest.approx(4 * MS))
    v["a"] = view("a", 2, alive=False)  # a dead nearest is skipped: b is the nearest live one
    assert NearestOnly().choose("o", v, lat, 0.0).site == "b"
    v = views(view("o", 3), view("a", 10))
    assert NearestOnly().choose("o", v, lat, 0.0, session_site="a").site == "o"  # ignores sessions


def test_make_selector_by_name():
    from routing.sites.site_policies import SITE_POLICIES, make_selector

    assert isinstance(make_selector("random_near", SiteSelectConfig(near_k=2), random.Random(1)), SiteSelector)
    assert type(make_selector("nearest_only")) is NearestOnly and type(make_selector("local_only")) is LocalOnly
    assert make_selector("nearest_only", SiteSelectConfig(max_queue_wait_s=0.5)).config.max_queue_wait_s == 0.5
    assert set(SITE_POLICIES) == {"random_near", "nearest_only", "local_only"}
    with pytest.raises(ValueError):
        make_selector("closest")
