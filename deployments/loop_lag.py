"""How late a replica's event loop runs what it scheduled: the front's own CPU, as a signal.

Every request a front serves waits on its one event loop: HTTP, Baton's stages,
vLLM's OpenAI layer and output handler. When the process wants more CPU than it
gets (its own work at a high rate, or neighbours on the same cores), callbacks
start late, and every request in flight is late by as much, whatever the
engine's own queue says. `tick` sleeps PERIOD_S again and again and records how
much later than asked it woke: the loop's lag. `LagMeter` keeps the samples for
the front's metrics (`baton_loop_lag_seconds`, drained when /metrics is read)
and their mean over the last second or so (`smoothed`), which admission reads
(deployments/front/pipeline/admit.py).

`LagMeter` is pure (time passed in); `tick` is its asyncio shell.
"""

from __future__ import annotations

import asyncio
from collections import deque

PERIOD_S = 0.02  # the ticker's sleep: 50 samples a second, a few microseconds of CPU each
HALF_LIFE_S = 0.5  # of `smoothed`: a collection's 10-40 ms pause moves it little, a busy second a lot
KEPT = 4096  # samples kept until the next `drain`, the latest


class LagMeter:
    """The loop's lag samples: `smoothed`, their exponentially weighted mean (half-life
    `half_life_s`), and the samples since the last `drain`."""

    def __init__(self, half_life_s: float = HALF_LIFE_S) -> None:
        if half_life_s <= 0:
            raise ValueError("half_life_s must be > 0")
        self.half_life_s = half_life_s
        self.smoothed = 0.0
        self._last: float | None = None
        self._samples: deque[float] = deque(maxlen=KEPT)

    def observe(self, lag_s: float, now: float) -> None:
        """Adds one sample taken at `now` (seconds, any monotonic clock). Changes `smoothed`."""
        lag_s = max(0.0, lag_s)
        if self._last is None:
            self.smoothed = lag_s
        else:
            keep = 0.5 ** (max(0.0, now - self._last) / self.half_life_s)
            self.smoothed = keep * self.smoothed + (1.0 - keep) * lag_s
        self._last = now
        self._samples.append(lag_s)

    def drain(self) -> list[float]:
        """The samples since the last call (at most the last KEPT), oldest first; forgets them."""
        out = list(self._samples)
        self._samples.clear()
        return out


METER = LagMeter()  # this process's loop, once `tick` runs in it


async def tick(meter: LagMeter = METER, period_s: float = PERIOD_S) -> None:
    """Measures the running loop's lag into `meter` until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time() + period_s
        await asyncio.sleep(period_s)
        now = loop.time()
        meter.observe(now - asked, now)
