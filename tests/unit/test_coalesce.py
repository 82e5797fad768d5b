"""coalesce(): ready items merge, order is kept, errors and cancellation propagate."""

from __future__ import annotations

import asyncio

import pytest

from actors.coalesce import coalesce


async def _burst(n: int, fail: bool = False):
    for i in range(n):
        yield i
    if fail:
        raise ValueError("boom")


def test_ready_items_arrive_as_one_batch_in_order():
    async def main():
        return [b async for b in coalesce(_burst(5))]
    batches = asyncio.run(main())
    assert [x for b in batches for x in b] == [0, 1, 2, 3, 4]
    assert len(batches) < 5  # a fast producer is batched


def test_slow_producer_is_not_delayed():
    async def slow():
        for i in range(3):
            await asyncio.sleep(0.01)
            yield i

    async def main():
        return [b async for b in coalesce(slow())]
    assert asyncio.run(main()) == [[0], [1], [2]]


def test_error_is_raised_after_the_items_before_it():
    async def main():
        seen = []
        with pytest.raises(ValueError):
            async for b in coalesce(_burst(2, fail=True)):
                seen.extend(b)
        return seen
    assert asyncio.run(main()) == [0, 1]


def test_closing_the_consumer_closes_the_source():
    closed = asyncio.Event()

    async def endless():
        try:
            i = 0
            while True:
                await asyncio.sleep(0.001)
                yield i
                i += 1
        finally:
            closed.set()

    async def main():
        agen = coalesce(endless())
        await agen.__anext__()
        await agen.aclose()
        await asyncio.wait_for(closed.wait(), 1)
    asyncio.run(main())
