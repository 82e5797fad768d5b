"""How late a replica's event loop runs what it scheduled: the front's own CPU, as a signal.

Every request a front serves waits on its one event loop: HTTP, Baton's stages,
vLLM's OpenAI layer and output handler. When the process wants more CPU than it
gets (its own work at a high rate, or neighbours on the same cores), callbacks
start late, and every request in flight is late by as much, whatever the
engine's own queue says. `tick` sleeps PERIOD_S again and again and records how
much later than asked it woke: the loop's lag. `drain` hands the samples to the
front's metrics when they are read (`baton_loop_lag_seconds`; `baton bench scale`
reports them at each rate), as deployments/gc_pauses.py hands over the collector's
pauses.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

PERIOD_S = 0.02  # the ticker's sleep: 50 samples a second, a few microseconds of CPU each
KEPT = 4096  # samples kept until the next `drain`, the latest
_lags: deque[float] = deque(maxlen=KEPT)


def drain() -> list[float]:
    """The lags (seconds) sampled since the last call (at most the last KEPT), oldest first; forgets them."""
    out = list(_lags)
    _lags.clear()
    return out


async def tick(period_s: float = PERIOD_S, on_lag: Callable[[float], None] | None = None) -> None:
    """Samples the running loop's lag until cancelled (a timer that woke early is no lag); each
    sample is also passed to `on_lag` (admission's deployments/admission/lag_limit.py)."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time() + period_s
        await asyncio.sleep(period_s)
        lag = max(0.0, loop.time() - asked)
        _lags.append(lag)
        if on_lag is not None:
            on_lag(lag)
