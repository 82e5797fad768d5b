"""Summary statistics shared by the benchmarks and the load generator."""

from __future__ import annotations

import math
from typing import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100), linear between ranks; None if empty.

    NaNs (for example the TPOT of a one-token answer) are left out.
    """
    s = sorted(v for v in values if not math.isnan(v))
    if not s:
        return None
    pos = q / 100 * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def latency_summary(ns: Sequence[int]) -> dict:
    """n, p50/p99/max in ms of nanosecond durations ({"n": 0} for none). Pure."""
    if not ns:
        return {"n": 0}
    ms = sorted(x / 1e6 for x in ns)
    return {"n": len(ms), "p50_ms": round(percentile(ms, 50), 4), "p99_ms": round(percentile(ms, 99), 4),
            "max_ms": round(ms[-1], 3)}
