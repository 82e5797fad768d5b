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


def test_the_drain_budget_follows_the_drains_and_is_short_after_one_ran_out():
    from actors.save_watch import DrainBudget

    budget = DrainBudget(full_s=10.0, floor_s=1.0, factor=20.0, weight=0.5)
    assert budget.seconds() == 10.0  # nothing drained yet
    budget.ended("push", 0.02)  # fast drains: the floor
    assert budget.seconds() == 1.0
    budget.ended("none_left", 0.18)  # slower ones (a loaded machine) lift it: 20 x the mean 0.1 s
    assert abs(budget.seconds() - 2.0) < 1e-9
    budget.ended("recheck", 3.0)
    assert budget.seconds() == 10.0  # never past the full wait
    budget.ended("timeout", 10.0)  # a stopped store: the next prefills wait 1 s
    assert budget.seconds() == 1.0
    budget.ended("timeout", 1.0)
    assert budget.seconds() == 1.0 and abs(budget.typical_s - 1.55) < 1e-9  # a timeout moves no mean
    budget.ended("push", 0.05)  # the store keeps up again
    assert not budget.slow and abs(budget.typical_s - 0.8) < 1e-9 and budget.seconds() == 10.0


def test_a_prefill_whose_saves_did_not_drain_tells_decode_not_to_ask_the_store():
    import json

    from common.constants import NO_LOOKUP
    from deployments.api import apis
    from deployments.front.pipeline.request import Request

    def body(store_lookup: bool, kind: str) -> dict:
        api = next(a for a in apis.APIS.values() if a.kind == kind)
        req = Request({"type": "http"}, None, None, api)
        req.tenant, req.ids, req.body = "t", [1, 2, 3], {"model": "m"}
        req.store_lookup = store_lookup
        return json.loads(req.engine_body())

    assert body(True, "chat")["kv_transfer_params"] == {"prompt_token_ids": [1, 2, 3]}
    assert body(False, "chat")["kv_transfer_params"] == {"prompt_token_ids": [1, 2, 3], NO_LOOKUP: True}
    assert body(False, "text")["kv_transfer_params"] == {NO_LOOKUP: True}
    assert "kv_transfer_params" not in body(True, "text")
