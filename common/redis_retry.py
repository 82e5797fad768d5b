"""Idempotent Redis calls that wait out a Redis restart instead of failing at once.

`baton up` restarts a Redis that died within a second or two, and its
append-only file brings the data back (redis.appendfsync). A write made in
that gap (a finished response to keep, a batch line's result) is worth
trying again for a while rather than losing, and a read a request needs
(the response a Responses turn continues) worth a short wait rather than
an error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis

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
