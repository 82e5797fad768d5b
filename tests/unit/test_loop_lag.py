"""The front's event-loop lag (deployments/loop_lag.py): the meter's mean and samples, and the ticker."""

import asyncio
import time

import pytest

from deployments.loop_lag import LagMeter, tick


def test_the_smoothed_lag_moves_halfway_in_a_half_life_and_keeps_no_negative_sample():
    m = LagMeter(half_life_s=1.0)
    m.observe(0.0, now=0.0)
    m.observe(0.2, now=1.0)
    assert m.smoothed == pytest.approx(0.1)
    m.observe(-0.01, now=1.0)  # a timer that woke early is no lag; no time passed: the mean stays
    assert m.smoothed == pytest.approx(0.1)
    m.observe(0.0, now=11.0)  # ten half-lives of a quiet loop later
    assert m.smoothed < 0.001
    assert m.drain() == [0.0, 0.2, 0.0, 0.0] and m.drain() == []


def test_the_ticker_sees_a_callback_that_holds_the_loop():
    async def run() -> LagMeter:
        m = LagMeter(half_life_s=0.05)
        task = asyncio.ensure_future(tick(m, period_s=0.005))
        await asyncio.sleep(0.02)
        time.sleep(0.1)  # the loop's one thread held, as a busy front holds it
        await asyncio.sleep(0.02)
        task.cancel()
        return m

    m = asyncio.run(run())
    assert max(m.drain()) >= 0.08
    with pytest.raises(ValueError):
        LagMeter(half_life_s=0)
