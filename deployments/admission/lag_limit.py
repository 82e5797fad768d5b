"""How many permits a front may grant while its own process keeps up: a limit that follows its event loop's lag.

A front's permits are sized for its engine: the engine's `max_num_seqs` on a GPU or
the timed executor (256 on the shipped profile, vLLM's default 1024 on an H100).
When what runs out is the front's process instead (its HTTP, vLLM's OpenAI layer and
output handler, Baton's stages; or neighbours on the same cores), more requests in
flight add no answers: each waits its turn in the one event loop, so every one of
them is later by as much. On 2 cores, disaggregated at 200 req/s
(docs/bench_scale.md), 256 permits answered 171 req/s with p50 1.3 s: 42 req/s
within a 1 s SLO; the same load held to 64 permits answered 162 req/s within it. The
loop's lag (deployments/loop_lag.py: how late a 20 ms timer wakes) is that signal; a
busy engine does not raise it (colocated at an engine's knee: 0.5 ms).

Every `interval_s`, from the mean lag of the samples since the last step:

    mean > high_s:  limit = max(floor, cut x min(limit, permits in use)), if more than
                    `floor` are in use (fewer are not what holds the loop: a start-up's lag);
                    cut = high_s / mean, within [0.5, 0.9]: a lag just over the bound
                    cuts a tenth, a lag twice the bound or more cuts half
    mean < low_s:   limit = min(ceiling, limit + max(1, grow x limit))
    otherwise:      unchanged

A cut starts from what is in flight, not from a limit far above it, so it bites at
once; growth is gentle, so the limit settles near what the process keeps up with.
Without the limit, on 2 cores, the decode front's mean lag was 1.4-7.5 ms at a load
it kept up with (disaggregated at 150 req/s) and 11-32 ms at one it could not (200),
seven runs each.
The limit never goes below `floor` (a CPU engine's CPU_CAPACITY: its 16 permits are
never cut) nor above the ceiling (the front's lease, passed at each step). Pure: time
comes in as `now`; no asyncio.
"""

from __future__ import annotations

import math

from common.config import AdmissionConfig
from common.config.admission import CPU_CAPACITY


MIN_SAMPLES = 3  # a window judged on fewer (a loop held for most of it) waits for more
DEEPEST_CUT, SHALLOWEST_CUT = 0.5, 0.9  # a cut keeps high_s / mean lag of what is in flight, within these


class LagLimit:
    """The permits a front's event-loop lag allows it, between `floor` and the lease."""

    def __init__(self, floor: int, high_s: float = 0.015, low_s: float = 0.0075, interval_s: float = 0.5,
                 grow: float = 0.2) -> None:
        if floor < 1:
            raise ValueError(f"floor must be >= 1, got {floor}")
        if not 0 <= low_s < high_s:
            raise ValueError(f"need 0 <= low_s < high_s, got {low_s}, {high_s}")
        if grow <= 0 or interval_s <= 0:
            raise ValueError("need grow > 0 and interval_s > 0")
        self.floor, self.high_s, self.low_s, self.interval_s = floor, high_s, low_s, interval_s
        self.grow = grow
        self.limit = math.inf  # no limit until the lag says so
        self._sum, self._n = 0.0, 0
        self._at: float | None = None

    def observe(self, lag_s: float) -> None:
        """One lag sample (seconds late); kept for the next `step`. Changes the window's sum."""
        self._sum += lag_s
        self._n += 1

    def step(self, now: float, in_use: int, ceiling: int) -> int:
        """The permits to grant now: min(ceiling, the limit). Once `interval_s` has passed since
        the window began, and it holds MIN_SAMPLES at least, moves the limit by the window's mean
        lag (see the module's docstring) and starts a new window."""
        if self._at is None:
            self._at = now
        elif now - self._at >= self.interval_s and self._n >= MIN_SAMPLES:
            mean = self._sum / self._n
            self._sum, self._n, self._at = 0.0, 0, now
            limit = min(self.limit, ceiling)
            if mean > self.high_s and in_use > self.floor:
                cut = min(SHALLOWEST_CUT, max(DEEPEST_CUT, self.high_s / mean))
                self.limit = max(min(self.floor, ceiling), round(cut * min(limit, in_use)))
            elif mean < self.low_s and self.limit != math.inf:
                grown = limit + max(1, int(self.grow * limit))
                self.limit = math.inf if grown >= ceiling else grown
        return int(min(self.limit, ceiling))


def from_config(config: AdmissionConfig) -> LagLimit | None:
    """The limit `config.max_loop_lag_s` asks for (None: none), its floor max(CPU_CAPACITY, a
    replica's permits / 8): a CPU engine's permits are never cut, a GPU engine's not below an eighth."""
    if config.max_loop_lag_s is None:
        return None
    high = config.max_loop_lag_s
    return LagLimit(max(CPU_CAPACITY, config.capacity // 8), high_s=high, low_s=high / 2)
