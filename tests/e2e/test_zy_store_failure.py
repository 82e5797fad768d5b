"""Killing the Mooncake store mid-run: requests keep succeeding by
recomputing, `baton status` reports the store degraded, and `baton up`
restarts it, after which decode loads KV from the store again."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.e2e import prompts
from tests.e2e.test_routing import chat


def _state(stack) -> dict:
    return json.loads((Path(stack.cfg["state_dir"]) / "state.json").read_text())


def _store_state(stack) -> str:
    report = json.loads(stack.baton("status", "--json").stdout)
    return next(c["state"] for c in report["components"] if c["name"] == "mooncake")


def test_requests_survive_the_store_dying_and_it_comes_back(stack):
    before = chat(stack, prompts.make("store-before", 200)).json()["baton"]
    assert before["decode_cached_tokens"] > 0
    store_pid = _state(stack)["children"]["mooncake-store"]
    os.kill(store_pid, signal.SIGKILL)
    for i in range(3):  # served meanwhile, recomputing what the store cannot give
        r = chat(stack, prompts.make(f"store-down-{i}", 200))
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
    deadline = time.monotonic() + 60
    while (_state(stack)["children"]["mooncake-store"] == store_pid
           or _store_state(stack) != "healthy") and time.monotonic() < deadline:
        time.sleep(1)
    assert _store_state(stack) == "healthy"
    # Workers reconnect to the new store within a few requests: KV flows again.
    loaded, deadline = 0, time.monotonic() + 60
    for i in range(30):
        loaded = chat(stack, prompts.make(f"store-after-{i}", 200)).json()["baton"]["decode_cached_tokens"]
        if loaded > 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert loaded > 0


def test_requests_survive_the_master_dying_and_kv_flows_again(stack):
    assert chat(stack, prompts.make("master-before", 200)).json()["baton"]["decode_cached_tokens"] > 0
    master_pid = _state(stack)["children"]["mooncake-master"]
    os.kill(master_pid, signal.SIGKILL)
    for i in range(3):
        r = chat(stack, prompts.make(f"master-down-{i}", 200))
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
    deadline = time.monotonic() + 60
    while (_state(stack)["children"]["mooncake-master"] == master_pid
           or _store_state(stack) != "healthy") and time.monotonic() < deadline:
        time.sleep(1)
    assert _store_state(stack) == "healthy"
    loaded, deadline = 0, time.monotonic() + 90
    for i in range(60):
        loaded = chat(stack, prompts.make(f"master-after-{i}", 200)).json()["baton"]["decode_cached_tokens"]
        if loaded > 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert loaded > 0
