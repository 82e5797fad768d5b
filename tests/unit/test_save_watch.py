"""SaveWatch: a prefill replica hears of finished KV saves over a real ZMQ socket."""

from __future__ import annotations

import asyncio
import contextlib
import time

import zmq

from actors.save_watch import SaveWatch


def _push(address: str, *internal_ids: str) -> None:
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.connect(address)
    for rid in internal_ids:
        sock.send_string(rid)
    sock.close(linger=1000)


@contextlib.asynccontextmanager
async def watching():
    watch = SaveWatch()
    watch.start()
    try:
        yield watch
    finally:
        watch.close()


def test_a_push_after_the_request_finished_ends_the_wait():
    async def main():
        async with watching() as watch:
            finished = time.monotonic()
            waiter = asyncio.create_task(watch.wait("prefill-abc", finished, timeout=5))
            await asyncio.sleep(0.05)
            assert not waiter.done()
            # vLLM's internal id is the external one plus "-" and 8 characters
            await asyncio.to_thread(_push, watch.address, "prefill-other-0badf00d", "prefill-abc-1234abcd")
            assert await asyncio.wait_for(waiter, 2)
            assert watch.saved_since("prefill-abc", finished)
            assert not watch.saved_since("prefill-abc", time.monotonic())

    asyncio.run(main())


def test_a_push_from_before_the_request_finished_does_not_count():
    """Between two chunks of one prefill the job queue can be empty for a moment."""
    async def main():
        async with watching() as watch:
            await asyncio.to_thread(_push, watch.address, "prefill-abc-1234abcd")
            for _ in range(100):
                if watch.saved_since("prefill-abc", 0):
                    break
                await asyncio.sleep(0.01)
            assert watch.saved_since("prefill-abc", 0)  # it arrived, and earlier than `finished`
            finished = time.monotonic()
            t0 = time.monotonic()
            assert not await watch.wait("prefill-abc", finished, timeout=0.2)
            assert time.monotonic() - t0 >= 0.19

    asyncio.run(main())


def test_remembers_a_bounded_number_of_pushes():
    from actors import save_watch

    async def main():
        async with watching() as watch:
            for i in range(save_watch.KEEP + 10):
                watch.arrived(f"r{i}", float(i))
            assert not watch.saved_since("r0", 0)
            assert watch.saved_since(f"r{save_watch.KEEP + 9}", 0)

    asyncio.run(main())
