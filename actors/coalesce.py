"""Batch the items of an async stream that are ready at the same moment.

Each streamed item crosses Ray as one object, which costs far more than a
decode step of a small model. A producer task drains the source into a queue;
the consumer takes everything queued so far as one batch. When the reader
keeps up, batches hold one item and latency is unchanged; when it falls
behind, items merge instead of piling up. No timer, no added wait.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, TypeVar

T = TypeVar("T")
_END = object()


async def coalesce(source: AsyncIterator[T]) -> AsyncIterator[list[T]]:
    """Yields non-empty lists of `source`'s items in order; re-raises its error.

    Closing or cancelling the consumer cancels the producer, which closes
    `source` (for vLLM, that aborts the request).
    """
    queue: asyncio.Queue = asyncio.Queue()

    async def pump() -> None:
        try:
            async for item in source:
                queue.put_nowait(item)
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            queue.put_nowait(exc)
        finally:
            queue.put_nowait(_END)

    task = asyncio.create_task(pump())
    try:
        while True:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            items = [x for x in batch if x is not _END and not isinstance(x, Exception)]
            if items:
                yield items
            for x in batch:
                if isinstance(x, Exception):
                    raise x
                if x is _END:
                    return
    finally:
        task.cancel()
