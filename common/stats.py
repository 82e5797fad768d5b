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
