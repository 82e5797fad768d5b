"""A front's shared view hands out the same live-replica dicts until something in them changes:
what lets request_routing derive each pool's load inputs once per view, not per decision."""

from __future__ import annotations

from deployments.front.shared_view import SharedView
from routing.prefix.redis_state import Registry


def _view(entries: dict, read_at: float = 100.0) -> SharedView:
    view = SharedView(None, Registry(None, timeout_s=10.0), max_age_s=1e9, on_error=lambda: None)
    view._view = (read_at, entries, {"decode": {}, "prefill": {}}, {"decode": {}, "prefill": {}})
    return view


def test_the_live_replicas_are_the_same_dicts_until_a_heartbeat_ages_out():
    view = _view({"decode": {"a": {"ts": 95.0}, "b": {"ts": 99.0}, "old": {"ts": 50.0}}, "prefill": {}})
    first, _, _ = view.get(None, 100.0)
    assert set(first["decode"]) == {"a", "b"}
    assert view.get(None, 104.0)[0] is first  # nobody aged out, nobody came back
    assert view.get(None, 105.0)[0] is first  # a's beat is exactly the timeout old: still live
    later = view.get(None, 105.5)[0]
    assert later is not first and set(later["decode"]) == {"b"}
    assert view.get(None, 106.0)[0] is later


def test_a_new_view_or_a_clock_that_went_back_gives_new_dicts():
    view = _view({"decode": {"a": {"ts": 95.0}}, "prefill": {}})
    first = view.get(None, 100.0)[0]
    assert view.get(None, 99.0)[0] is not first  # before the cached answer's time: derived again
    view._view = (101.0, {"decode": {"a": {"ts": 101.0}, "b": {"ts": 101.0}}, "prefill": {}}, {}, {})
    fresh = view.get(None, 101.0)[0]
    assert set(fresh["decode"]) == {"a", "b"} and fresh is not first


def test_a_forgotten_replica_stays_out_while_the_registry_still_lists_it():
    """A front whose own engine died forgets its replica: its routing sends elsewhere at once,
    before its registry entry is gone from a read (deployments/replica.py `_watch_engine`)."""
    view = _view({"decode": {"a": {"ts": 99.0}, "b": {"ts": 99.0}}, "prefill": {}})
    assert set(view.get(None, 100.0)[0]["decode"]) == {"a", "b"}
    view.forget("decode", "a")
    assert set(view.get(None, 100.0)[0]["decode"]) == {"b"}
    view._view = (101.0, {"decode": {"a": {"ts": 101.0}, "b": {"ts": 101.0}}, "prefill": {}}, {}, {})
    assert set(view.get(None, 101.0)[0]["decode"]) == {"b"}
