"""The front's event-loop lag (deployments/loop_lag.py): the ticker's samples, drained into the metrics."""

import asyncio
import time

from deployments import loop_lag
from deployments.front.metrics import IngressMetrics


def test_the_ticker_sees_a_callback_that_holds_the_loop_and_the_metrics_get_each_sample_once():
    async def run() -> None:
        task = asyncio.ensure_future(loop_lag.tick(period_s=0.005))
        await asyncio.sleep(0.02)
        time.sleep(0.1)  # the loop's one thread held, as a busy front holds it
        await asyncio.sleep(0.02)
        task.cancel()

    loop_lag.drain()
    asyncio.run(run())
    lags = loop_lag.drain()
    assert max(lags) >= 0.08 and min(lags) >= 0.0  # no sample below zero
    assert loop_lag.drain() == []
    asyncio.run(run())
    text = IngressMetrics().render().decode()
    assert "baton_loop_lag_seconds_count" in text and "baton_loop_lag_seconds_count 0.0" not in text
    assert loop_lag.drain() == []


def test_each_sample_also_reaches_admission_s_lag_limit():
    from deployments.admission.lag_limit import LagLimit

    limit = LagLimit(floor=4, interval_s=0.01)
    seen: list[float] = []

    async def run() -> None:
        task = asyncio.ensure_future(loop_lag.tick(0.005, on_lag=lambda lag: (seen.append(lag), limit.observe(lag))))
        limit.step(time.monotonic(), 0, 64)
        await asyncio.sleep(0.02)
        time.sleep(0.3)  # a held loop: a late wake, the window's mean far over 15 ms
        await asyncio.sleep(0.02)
        task.cancel()

    loop_lag.drain()
    asyncio.run(run())
    assert seen == loop_lag.drain() and max(seen) >= 0.25
    assert limit.step(time.monotonic(), 40, 64) == 20  # half of the 40 in flight
