"""Routing on the real stack (1 prefill, 2 decode replicas): index exactness,
session pins, tenant isolation, decode-only for short prompts, metrics."""

from __future__ import annotations

import time
import urllib.request

import httpx
import pytest

from tests.e2e import prompts
from tests.e2e.conftest import KEY_A, KEY_B, PIN_TTL_S

EVENTS_SETTLE_S = 1.5  # KV events reach the index in Redis asynchronously


def chat(stack, messages, key=None, session=None, max_tokens=4) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    if session:
        headers["x-session-affinity"] = session
    r = httpx.post(f"{stack.url}/v1/chat/completions", headers=headers, timeout=120,
                   json={"model": "baton-tiny", "messages": messages, "max_tokens": max_tokens,
                         "temperature": 0})
    assert r.status_code == 200, r.text
    return r


def engine_hit(baton: dict) -> int:
    """Cached tokens reported by the engine that computed the prompt."""
    return baton["decode_cached_tokens"] if baton["decode_only"] else baton["prefill_cached_tokens"]


@pytest.fixture(scope="module", autouse=True)
def ttl_pin(stack) -> dict:
    """A session pinned as this module starts, which nothing refreshes: the TTL test, last in the
    module, waits only what of the TTL the tests before it did not take."""
    import redis

    chat(stack, prompts.make("ttl", 20), session="sess-ttl")
    key = "baton:pin:decode:sess-ttl"
    return {"key": key, "at": time.monotonic(), "set": redis.Redis.from_url(stack.cfg["redis"]["url"]).get(key)}


def test_index_predicts_the_engines_cached_tokens(stack):
    base = prompts.make("exact", 300)
    turns = [base, base, base + [{"role": "assistant", "content": "sure"},
                                 {"role": "user", "content": "and then? " * 30}]]
    seen = []
    for messages in turns:
        baton = chat(stack, messages).json()["baton"]
        seen.append((baton["predicted_cached_tokens"], engine_hit(baton), baton["decode_only"]))
        time.sleep(EVENTS_SETTLE_S)
    assert all(pred == hit for pred, hit, _ in seen), seen
    assert seen[0][0] == 0 and seen[1][0] > 0 and seen[2][0] >= seen[1][0]


def _wait_idle_beats(stack, timeout_s: float = 15) -> None:
    """Until every replica's heartbeat, written after now, reports an idle engine: the router then
    prices the next turn on current loads, not on a beat that still counted the previous turn."""
    import json

    import redis

    from routing.prefix.redis_state import registry_key

    client, since = redis.Redis.from_url(stack.cfg["redis"]["url"]), time.time()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        entries = [json.loads(v) for pool in ("prefill", "decode")
                   for v in client.hgetall(registry_key(pool)).values()]
        if entries and all(e["ts"] > since and not e.get("unfinished") for e in entries):
            return
        time.sleep(0.1)


def test_session_is_pinned_and_header_echoed(stack):
    answers = []
    conversation = prompts.make("pin", 80)
    for turn in range(3):
        if turn:
            time.sleep(EVENTS_SETTLE_S)  # the index has the last turn's blocks: the pinned replica holds them
        _wait_idle_beats(stack)
        r = chat(stack, conversation, session="sess-pin")
        assert r.headers["x-session-affinity"] == "sess-pin"
        answers.append(r.json()["baton"])
        conversation = conversation + [{"role": "assistant", "content": "ok"},
                                       {"role": "user", "content": f"turn {turn}"}]
    assert len({a["decode_replica"] for a in answers}) == 1, answers  # the costs say why a turn moved
    assert [a["route"] for a in answers[1:]] == ["pinned", "pinned"]


def test_tenants_never_share_a_prefix(stack):
    messages = prompts.make("tenant", 200)
    first = chat(stack, messages, key=KEY_A).json()
    time.sleep(EVENTS_SETTLE_S)
    again = chat(stack, messages, key=KEY_A).json()
    other = chat(stack, messages, key=KEY_B).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert other["baton"]["predicted_cached_tokens"] == 0


def test_wrong_api_key_is_401(stack):
    r = httpx.post(f"{stack.url}/v1/chat/completions", timeout=30,
                   headers={"authorization": "Bearer nope"},
                   json={"model": "baton-tiny", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_short_prompt_runs_decode_only(stack):
    baton = chat(stack, [{"role": "user", "content": "hi"}]).json()["baton"]
    assert baton["decode_only"] is True and baton["prefill_cached_tokens"] is None
    assert "prefill_replica" not in baton


def test_metrics_report_routing(stack):
    text = urllib.request.urlopen(f"{stack.url}/metrics", timeout=10).read().decode()
    assert 'baton_route_decisions_total{pool="decode",reason="pinned"}' in text
    assert "baton_prefix_hit_ratio" in text and "baton_repins_total" in text
    # Every answer with usage counts into the hit ratio, summed over the fronts.
    prompt_blocks = next(float(l.split()[-1]) for l in text.splitlines() if l.startswith("baton_prompt_blocks_total"))
    hit_blocks = next(float(l.split()[-1]) for l in text.splitlines() if l.startswith("baton_prefix_hit_blocks_total"))
    assert prompt_blocks > 0 and hit_blocks > 0


def test_every_engine_reports_its_schedulers_load_in_the_registry(stack):
    """Each replica's heartbeat carries what its engine's scheduler says: running and
    waiting requests, free and total KV blocks, the oldest wait. The router reads
    the free blocks for its cold-prompt draw (tests/unit/test_routing_peers.py)."""
    import json

    import redis

    from routing.prefix.redis_state import registry_key

    assert chat(stack, prompts.make("load report", 40)).status_code == 200
    r = redis.Redis.from_url(stack.cfg["redis"]["url"])
    deadline = time.time() + 30
    while True:
        entries = {pool: {k.decode(): json.loads(v) for k, v in r.hgetall(registry_key(pool)).items()}
                   for pool in ("prefill", "decode")}
        reports = [e for pool in entries.values() for e in pool.values()]
        if reports and all("kv_blocks" in e for e in reports) or time.time() > deadline:
            break
        time.sleep(0.5)
    assert len(entries["decode"]) == 2 and len(entries["prefill"]) == 1, entries
    for e in reports:
        assert e["kv_blocks"] == e["capacity_blocks"] > 0, e
        assert 0 <= e["kv_free_blocks"] <= e["kv_blocks"], e
        assert e["running"] >= 0 and e["waiting"] >= 0 and e["oldest_wait_s"] >= 0, e


def test_pin_expires_after_its_ttl(stack, ttl_pin):
    import redis

    assert ttl_pin["set"] is not None
    time.sleep(max(0.0, ttl_pin["at"] + PIN_TTL_S + 1 - time.monotonic()))
    assert redis.Redis.from_url(stack.cfg["redis"]["url"]).get(ttl_pin["key"]) is None
    assert chat(stack, prompts.make("ttl2", 20), session="sess-ttl").json()["baton"]["route"] != "pinned"
