"""Killing the Mooncake store or master mid-run: requests keep succeeding by
recomputing, `baton status` reports the store degraded, and `baton up`
restarts it, after which decode loads KV from the store again (the `destructive` fixture:
after every test that needs the shared stack whole)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.e2e import prompts
from tests.e2e.test_routing import chat

pytestmark = pytest.mark.usefixtures("destructive")


def _store_state(stack) -> str:
    report = json.loads(stack.baton("status", "--json").stdout)
    return next(c["state"] for c in report["components"] if c["name"] == "mooncake")


@pytest.mark.parametrize("child", ["mooncake-store", "mooncake-master"])
def test_requests_survive_a_mooncake_process_dying_and_kv_flows_again(stack, child):
    before = chat(stack, prompts.make(f"{child}-before", 200)).json()["baton"]
    assert before["decode_cached_tokens"] > 0
    pid = stack.state()["children"][child]
    os.kill(pid, signal.SIGKILL)
    for i in range(3):  # served meanwhile, recomputing what the store cannot give
        r = chat(stack, prompts.make(f"{child}-down-{i}", 200))
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
    deadline = time.monotonic() + 60
    while (stack.state()["children"][child] == pid
           or _store_state(stack) != "healthy") and time.monotonic() < deadline:
        time.sleep(1)
    assert _store_state(stack) == "healthy"
    # Workers reconnect within a few requests: KV flows again.
    loaded, deadline = 0, time.monotonic() + 90
    for i in range(60):
        loaded = chat(stack, prompts.make(f"{child}-after-{i}", 200)).json()["baton"]["decode_cached_tokens"]
        if loaded > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert loaded > 0
