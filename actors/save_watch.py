"""Where a prefill replica hears that a request's KV is saved, instead of polling.

The replica's worker (actors/kv_probe.py, `watch_kv_saves`) pushes a
request's id each time its last queued store job finishes. `SaveWatch` binds
the PULL end on a Unix socket (no network listener), notes when each
request's push arrived, and wakes whoever waits for it.

A push means "no store job queued at this moment". During a chunked prefill
that can happen between two chunks, so a waiter only trusts a push that
arrived after its request finished generating: no job is added after that.

`DrainBudget` says how long a prefill waits for its saves: a stopped store
(SIGSTOP, a hung host) holds each put for Mooncake's transfer timeout
(30 s) and every save queued behind it, so once one wait has run out the
next ones are short until a wait ends in time again; while it keeps up, the
wait is bounded by a multiple of what drains take.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections import OrderedDict

KEEP = 4096  # pushes remembered, for waiters that come late


class DrainBudget:
    """How long the next prefill waits for its KV saves; pure, no clock of its own.

    `factor` times the drains that ended in time lately (a moving mean), at least
    `floor_s` and at most `full_s`; after a wait ran out (the store stopped or far
    behind: the request's decode then recomputes rather than loads,
    deployments/front/pipeline/prefill.py), `floor_s` until one ends in time again."""

    def __init__(self, full_s: float, floor_s: float, factor: float = 20.0, weight: float = 0.1) -> None:
        self.full_s, self.floor_s, self.factor, self.weight = full_s, floor_s, factor, weight
        self.typical_s: float | None = None  # moving mean of the drains that ended in time
        self.slow = False

    def seconds(self) -> float:
        """The wait the next drain may take; changes nothing."""
        if self.slow:
            return self.floor_s
        if self.typical_s is None:
            return self.full_s
        return min(self.full_s, max(self.floor_s, self.factor * self.typical_s))

    def ended(self, end: str, took_s: float) -> None:
        """Records how a drain ended (`timeout`, or anything else: in time) and how long it
        took; opens or closes the short budget, and moves the mean with a drain in time."""
        self.slow = end == "timeout"
        if not self.slow:
            w = 1.0 if self.typical_s is None else self.weight
            self.typical_s = took_s if self.typical_s is None else (1 - w) * self.typical_s + w * took_s


class SaveWatch:
    """The PULL socket and the arrival time of each request's last push."""

    def __init__(self):
        import zmq
        import zmq.asyncio

        self._dir = tempfile.mkdtemp(prefix="baton-saves-")
        self.address = f"ipc://{os.path.join(self._dir, 'saves')}"
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(self.address)
        self._arrived: OrderedDict[str, float] = OrderedDict()
        self._waiters: dict[str, asyncio.Event] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Starts reading pushes on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        while True:
            internal = (await self._sock.recv()).decode()
            self.arrived(internal.rsplit("-", 1)[0], time.monotonic())

    def arrived(self, request_id: str, now: float) -> None:
        """Records a push for `request_id` (vLLM's external id) at `now`; wakes its waiter."""
        self._arrived[request_id] = now
        self._arrived.move_to_end(request_id)
        while len(self._arrived) > KEEP:
            self._arrived.popitem(last=False)
        if (event := self._waiters.get(request_id)) is not None:
            event.set()

    def saved_since(self, request_id: str, since: float) -> bool:
        """Whether a push for `request_id` arrived at or after `since`."""
        return self._arrived.get(request_id, -1.0) >= since

    async def wait(self, request_id: str, since: float, timeout: float) -> bool:
        """Waits up to `timeout` for a push for `request_id` at or after `since`."""
        deadline = time.monotonic() + timeout
        event = self._waiters.setdefault(request_id, asyncio.Event())
        try:
            while not self.saved_since(request_id, since):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                event.clear()
                try:
                    await asyncio.wait_for(event.wait(), left)
                except asyncio.TimeoutError:
                    return self.saved_since(request_id, since)
            return True
        finally:
            self._waiters.pop(request_id, None)

    def close(self) -> None:
        """Stops reading and removes the socket file."""
        if self._task is not None:
            self._task.cancel()
        self._sock.close()
        self._ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)
