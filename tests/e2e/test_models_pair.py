"""Many models on two replicas (issue 32): a session or a resident model keeps its replica.

A stack of its own, after test_models.py's (a module each, so that one stops before the
other starts): two colocated replicas without the colocated router, each with room for one
model of the catalogue.
"""

from __future__ import annotations

import time

import pytest
import yaml

from common.constants import REPO_ROOT
from tests.e2e import prompts
from tests.e2e.test_models import FIRST, KEY_A, MIN_RESIDENT_S, SMALL, _chat, _client, _make_resident, _samples


@pytest.fixture(scope="module")
def pair_stack(tmp_path_factory):
    """Two replicas that each serve their own engines, with room for one model each."""
    from bench.common.stack import StackProcess, write_config

    cfg = yaml.safe_load((REPO_ROOT / "cluster" / "catalogue.yaml").read_text())
    s = StackProcess(write_config(
        tmp_path_factory.mktemp("pair"), colocated=True, decode={"replicas": 2, "kv_cache_gb": 0.25},
        routing={"colocated_router": False, "heartbeat_s": 1}, models=[m for m in cfg["models"] if m["id"] == SMALL],
        catalogue={"memory_gb": 0.3, "min_resident_s": MIN_RESIDENT_S}))
    s.start()
    yield s
    assert s.stop() == 0, s.tail()


def test_a_session_stays_on_its_replica_within_a_model(pair_stack):
    # Both replicas start with FIRST resident; without its pin, a turn runs on whichever front the
    # kernel gives its connection. With it, every turn goes back to the first turn's replica.
    replicas, routes = set(), []
    for _ in range(12):  # a new connection each: some reach the other front
        r = _chat(pair_stack, FIRST, headers={"x-session-affinity": "model-session"})
        assert r.status_code == 200, r.text
        replicas.add(r.json()["baton"]["decode_replica"])
        routes.append(r.json()["baton"]["route"])
    assert len(replicas) == 1, routes
    assert "pinned" in routes, routes  # some turns reached the other front and were sent back


def test_a_sessionless_conversation_stays_on_its_replica_within_a_model(pair_stack):
    # No header: the prompt's prefix blocks are its keys, so later turns (a longer conversation, on
    # new connections that reach either front) go back to the first turn's replica.
    messages = [{"role": "user", "content": "Remember the word heron."}]
    replicas, routes = set(), []
    for turn in range(12):  # a new connection each: 2^-11 that all reach the same front
        body = {"model": FIRST, "messages": messages, "max_tokens": prompts.MAX_TOKENS, "temperature": 0}
        with _client(pair_stack, KEY_A) as c:
            r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        replicas.add(r.json()["baton"]["decode_replica"])
        routes.append(r.json()["baton"]["route"])
        messages = messages + [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                               {"role": "user", "content": f"And turn {turn}?"}]
    assert len(replicas) == 1, routes
    assert "prefix" in routes, routes  # some turns reached the other front and were sent back


def test_conversations_that_share_a_system_prompt_meet_its_cache_within_a_model(pair_stack):
    # Different conversations, the same long system prompt: each new one goes where the prompt ran
    # (a prefix of two blocks or more), and finds it in that engine's cache.
    system = {"role": "system", "content": "You answer in one word. " * 60}
    replicas, routes, cached = set(), [], []
    for n in range(12):  # a new connection each: some reach the other front
        body = {"model": FIRST, "messages": [system, {"role": "user", "content": f"Question {n}?"}],
                "max_tokens": 4, "temperature": 0}
        with _client(pair_stack, KEY_A) as c:
            r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        replicas.add(r.json()["baton"]["decode_replica"])
        routes.append(r.json()["baton"]["route"])
        cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert len(replicas) == 1, routes
    assert "prefix" in routes, routes
    assert min(cached[1:]) > 0, cached  # every later conversation reused the system prompt's blocks


def test_a_model_resident_on_another_replica_is_served_there_not_woken_twice(pair_stack):
    _make_resident(pair_stack, SMALL)  # on whichever replica the kernel gave the connection
    time.sleep(3)  # the replicas' heartbeats now say where it is
    wakes = {k["model"]: v for k, v in _samples(pair_stack, "baton_model_wakes_total")}
    routes, seen = [], []
    for _ in range(12):  # a new connection each: the kernel spreads them over both replicas
        r = _chat(pair_stack, SMALL)
        assert r.status_code == 200, r.text
        routes.append(r.json()["baton"]["route"])
        seen.append((r.json()["baton"]["route"], r.json()["baton"]["decode_replica"]))
    now = {k["model"]: v for k, v in _samples(pair_stack, "baton_model_wakes_total")}
    # Forwarded by one front ("model"; "prefix" once the first turn recorded where these same
    # messages ran), run locally by the other.
    assert {"model", "prefix"} & set(routes) and "colocated" in routes, (seen, wakes, now)
    assert now == wakes
