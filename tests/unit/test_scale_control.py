"""Pure helpers of bench/scale/scale_control.py: the engines' event rate (actors/sim/profile.py) and the latency summary (common/stats.py)."""

from __future__ import annotations

import pytest

from actors.sim.profile import GpuProfile, engine_rates
from common.stats import latency_summary


def test_engine_rates_follow_the_profile():
    p = GpuProfile.load()
    r = engine_rates(p)
    # A full-prefill H100 stores ~2,500 blocks/s; a chat load at 70% stores a fraction of it.
    assert 2000 < r["full_prefill_blocks_per_s"] < 3000
    assert 0 < r["blocks_per_s"] < 0.7 * r["full_prefill_blocks_per_s"]
    assert r["step_ms"] == pytest.approx(1000 * (p.decode_s(64, 4096) + p.step_overhead_s), rel=1e-3)


def test_engine_rates_scale_with_busy_share():
    p = GpuProfile.load()
    half, full = engine_rates(p, busy=0.35), engine_rates(p, busy=0.7)
    assert full["blocks_per_s"] == pytest.approx(2 * half["blocks_per_s"], rel=1e-2)


def test_summary_in_ms():
    s = latency_summary([1_000_000] * 99 + [10_000_000])
    assert s["n"] == 100 and s["p50_ms"] == 1.0 and s["max_ms"] == 10.0
    assert 1.0 < s["p99_ms"] <= 10.0
    assert latency_summary([]) == {"n": 0}


def test_the_heap_figure_builds_a_fronts_and_the_indexers_state_and_times_full_collections():
    """bench/scale/routing_heap.py at a small size, with this tree's classes and, as a baseline, the
    same classes read back from git at HEAD: the figure's fields, and no tracked object per block
    or per session."""
    import tempfile
    from pathlib import Path

    from bench.scale.routing_heap import _fill, _fill_indexer, measure, state_classes

    with tempfile.TemporaryDirectory() as tmp:
        for rev in (None, "HEAD"):
            classes = state_classes(rev, Path(tmp))
            front = measure(lambda p: _fill(classes, 4, 1000, 2000, p), 4, progress=False)
            indexer = measure(lambda p: _fill_indexer(classes, 4, 1000, p), 4, progress=False)
            for out in (front, indexer):
                assert out["blocks"] >= 4000 and out["blocks_per_s"] > 0 and out["full_collection_ms"] >= 0
                if rev is None:
                    assert out["tracked_objects_added"] < 100, out
