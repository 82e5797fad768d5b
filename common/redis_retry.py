"""Idempotent Redis calls that wait out a Redis restart instead of failing at once.

`baton up` restarts a Redis that died within a second or two, and its
append-only file brings the data back (redis.appendfsync). A write made in
that gap (a finished response to keep, a batch line's result) is worth
trying again for a while rather than losing, and a read a request needs
(the response a Responses turn continues) worth a short wait rather than
an error.

A restart also breaks connections mid-use. Under uvloop (Ray Serve's event
loop), redis-py's asyncio client raises a bare RuntimeError ("the handler is
closed") when it writes to a connection Redis closed under it, where every
caller expects a ConnectionError: a `baton bench chaos` Redis kill at 16
replicas turned one routing read into a 500. `SafeConnection` raises a
ConnectionError instead, which the fronts' clients retry or fall back on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis
import redis.asyncio

T = TypeVar("T")
FIRST_PAUSE_S, LONGEST_PAUSE_S = 0.05, 0.5


async def retried(call: Callable[[], Awaitable[T]], retry_s: float) -> T:
    """`await call()`, tried again (pauses doubling from FIRST_PAUSE_S to LONGEST_PAUSE_S) while
    it raises a RedisError, for up to `retry_s`; then that error is raised. `call` must be
    idempotent: a write whose reply was lost may be applied twice."""
    deadline, pause = time.monotonic() + retry_s, FIRST_PAUSE_S
    while True:
        try:
            return await call()
        except redis.RedisError:
            if time.monotonic() + pause > deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(LONGEST_PAUSE_S, pause * 2)


class SafeConnection(redis.asyncio.Connection):
    """redis-py's asyncio connection, whose writes to a transport closed under them (uvloop's
    RuntimeError) raise a ConnectionError and drop the connection, as a failed socket write does."""

    async def send_packed_command(self, command, check_health: bool = True) -> None:
        try:
            await super().send_packed_command(command, check_health)
        except RuntimeError as exc:
            await self.disconnect(nowait=True)
            raise redis.ConnectionError(f"Error while writing to {self.host}:{self.port}: {exc}") from exc
