import asyncio

import pytest

from deployments.admission import Admission, AdmissionConfig, AsyncAdmission, Shed, ShedReason

pytestmark = pytest.mark.timeout(10)


def gate(capacity: int = 1, per_tenant: int = 10, total: int = 20, deadline_s: float = 30.0) -> AsyncAdmission:
    return AsyncAdmission(Admission(AdmissionConfig(capacity_per_replica=capacity, max_queue_per_tenant=per_tenant,
                                                     max_queue_total=total, default_deadline_s=deadline_s)))


async def settle() -> None:
    """Lets every ready task run up to its next wait (generously, so the
    order of pushes never depends on how many awaits `acquire` has)."""
    for _ in range(20):
        await asyncio.sleep(0)


def test_waiter_wakes_when_the_permit_is_released():
    async def main():
        g = gate()
        p1 = await g.acquire("a")
        waiter = asyncio.create_task(g.acquire("b"))
        await settle()
        assert not waiter.done() and len(g.admission.queue) == 1
        p1.release()  # generation ended; the stream may still be flowing
        p2 = await waiter
        assert p2.ticket.tenant == "b" and not p2.released and p1.released
        assert g.admission.permits.in_use == 1
        p2.release()
        assert g.admission.permits.in_use == 0
    asyncio.run(main())


async def holder_and_two_waiters(g: AsyncAdmission, holder: str, first: str, second: str):
    """Takes the one permit for `holder` and queues `first`, then `second`."""
    p1 = await g.acquire(holder)
    waiter = asyncio.create_task(g.acquire(first))
    other = asyncio.create_task(g.acquire(second))
    await settle()
    return p1, waiter, other


def test_release_is_idempotent():
    async def main():
        g = gate()
        p1, waiter, third = await holder_and_two_waiters(g, "a", "a", "a")
        p1.release()
        p1.release()  # must not free the permit just handed to the waiter
        await settle()
        assert waiter.done() and not third.done()
        assert g.admission.permits.in_use == 1
        (await waiter).release()
        (await third).release()
        assert g.admission.permits.in_use == 0
        assert g.snapshot().tenants["a"].stats.completed == 3
    asyncio.run(main())


def test_shed_when_the_deadline_passes_while_queued():
    async def main():
        g = gate()
        p1 = await g.acquire("a")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(Shed) as err:
            await g.acquire("b", deadline_s=0.05)
        assert 0.04 <= loop.time() - t0 < 1.0
        assert (err.value.status_code, err.value.reason) == (429, ShedReason.EXPIRED)
        assert err.value.retry_after_s >= 1
        assert err.value.headers == {"Retry-After": str(err.value.retry_after_s)}
        assert len(g.admission.queue) == 0 and not g._timers and not g._waiters
        p1.release()
    asyncio.run(main())


def test_rejected_at_once_when_the_tenant_queue_is_full():
    async def main():
        g = gate(per_tenant=1, total=1)
        p1 = await g.acquire("a")
        waiter = asyncio.create_task(g.acquire("a"))
        await settle()
        with pytest.raises(Shed) as err:
            await g.acquire("a")
        assert err.value.reason == ShedReason.TENANT_QUEUE_FULL and err.value.retry_after_s >= 1
        p1.release()
        (await waiter).release()
    asyncio.run(main())


def test_displaced_waiter_gets_shed():
    async def main():
        g = gate(per_tenant=2, total=2)
        p1 = await g.acquire("heavy")
        heavy = [asyncio.create_task(g.acquire("heavy")) for _ in range(2)]
        await settle()
        light = asyncio.create_task(g.acquire("light"))
        await settle()
        with pytest.raises(Shed) as err:
            await heavy[1]  # the newest request of the longest queue
        assert err.value.reason == ShedReason.DISPLACED
        assert not heavy[0].done() and not light.done()
        p1.release()
        (await heavy[0]).release()
        (await light).release()
    asyncio.run(main())


def test_cancelling_a_waiting_acquire_removes_it_from_the_queue():
    async def main():
        g = gate()
        p1 = await g.acquire("a")
        waiter = asyncio.create_task(g.acquire("b"))
        await settle()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert len(g.admission.queue) == 0 and not g._timers and not g._waiters
        assert g.admission.stats["b"].cancelled == 1
        p1.release()
        assert g.admission.permits.in_use == 0
    asyncio.run(main())


def test_cancel_after_the_permit_was_granted_gives_it_back():
    async def main():
        g = gate()
        p1, waiter, next_one = await holder_and_two_waiters(g, "a", "b", "c")
        p1.release()  # grants the permit to the waiter ...
        waiter.cancel()  # ... which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await waiter
        p3 = await next_one  # the permit moved on instead of leaking
        assert p3.ticket.tenant == "c" and g.admission.permits.in_use == 1
        p3.release()
    asyncio.run(main())


def test_slot_releases_on_exit_and_tolerates_early_release():
    async def main():
        g = gate()
        async with g.slot("a") as permit:
            assert g.admission.permits.in_use == 1
            permit.release()  # generation ended before the block did
            assert g.admission.permits.in_use == 0
        with pytest.raises(RuntimeError):
            async with g.slot("a"):
                raise RuntimeError("boom")
        assert g.admission.permits.in_use == 0
    asyncio.run(main())


def test_set_capacity_wakes_waiters():
    async def main():
        g = gate()
        p1 = await g.acquire("a")
        waiter = asyncio.create_task(g.acquire("b"))
        await settle()
        g.set_capacity(2)
        p2 = await waiter
        assert g.admission.permits.in_use == 2
        p1.release()
        p2.release()
    asyncio.run(main())
