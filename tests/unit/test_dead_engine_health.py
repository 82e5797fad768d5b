"""A replica whose engine core died alone (deployments/replica.py `check_health`): Serve's
health probe fails only once the requests it took while the engine lived have ended, or the
request deadline passed since the death. Stopping it earlier cut the answers its front had
placed again on other replicas and was relaying (tests/e2e/test_engine_death.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from common.config import BatonConfig
from deployments.replica import EngineReplica


class _Engine:
    def __init__(self) -> None:
        self.dead = False

    def errored(self) -> bool:
        return self.dead

    def shutdown(self) -> None:  # the replica's __del__ stops its engine
        pass


def _replica() -> EngineReplica:
    r = EngineReplica.__new__(EngineReplica)  # no engine, no Ray: only what check_health reads
    r.cfg = BatonConfig.model_validate({"serve": {"request_timeout_s": 60}})
    r.role, r.replica, r.tasks, r.engine = "colocated", "r1", [], _Engine()
    r.in_flight, r.in_flight_alive, r.died_at = 0, 0, None
    return r


def _healthy(r: EngineReplica) -> bool:
    try:
        asyncio.run(r.check_health())
        return True
    except RuntimeError:
        return False


def test_a_dead_engine_with_nothing_in_flight_fails_at_once():
    r = _replica()
    r.engine.dead, r.died_at = True, time.monotonic()
    assert not _healthy(r)


def test_requests_taken_before_the_death_keep_it_up_until_they_end():
    r = _replica()
    r.in_flight = r.in_flight_alive = 2
    r.engine.dead, r.died_at = True, time.monotonic()
    assert _healthy(r)
    r.in_flight += 5  # requests that came after the death keep nothing up
    r.in_flight_alive = 0
    assert not _healthy(r)


def test_not_beyond_the_request_deadline():
    r = _replica()
    r.in_flight = r.in_flight_alive = 1
    r.engine.dead, r.died_at = True, time.monotonic() - 61
    assert not _healthy(r)


@pytest.mark.parametrize("alive_when_it_came", [True, False])
def test_the_counting_wrapper_tells_which_requests_came_while_the_engine_lived(alive_when_it_came):
    r = _replica()
    r.signals = type("Signals", (), {"arrived": lambda self, path, public: None})()
    if not alive_when_it_came:
        r.died_at = time.monotonic()
    seen = {}

    async def app(scope, receive, send):
        seen["alive"] = r.in_flight_alive

    asyncio.run(r._counting(app, public=True)({"type": "http", "path": "/v1/chat/completions"}, None, None))
    assert seen["alive"] == int(alive_when_it_came) and r.in_flight == r.in_flight_alive == 0
