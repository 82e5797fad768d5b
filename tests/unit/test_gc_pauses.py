"""deployments/gc_pauses.py: the cyclic collector's pauses, observed and drained into the metrics."""

from __future__ import annotations

import gc

import pytest

from deployments import gc_pauses
from deployments.front.metrics import IngressMetrics


@pytest.fixture
def watching():
    gc_pauses.watch()
    gc_pauses.watch()  # a second call adds no second callback
    yield
    gc.callbacks.remove(gc_pauses._timed)
    gc_pauses.drain()


def test_each_collection_reaches_the_metrics_once(watching):
    assert gc.callbacks.count(gc_pauses._timed) == 1
    gc_pauses.drain()
    gc.collect()
    gc.collect(0)
    pauses = gc_pauses.drain()
    assert [g for g, _ in pauses][-2:] == [2, 0] and all(s >= 0 for _, s in pauses)
    assert gc_pauses.drain() == []
    gc.collect()
    text = IngressMetrics().render().decode()
    assert 'baton_gc_pause_seconds_count{generation="2"} 1.0' in text


def test_space_out_spaces_only_the_young_collections():
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 11, 12)
        gc_pauses.space_out()
        assert gc.get_threshold() == (gc_pauses.YOUNG_THRESHOLD, 11, 12)
    finally:
        gc.set_threshold(*before)
