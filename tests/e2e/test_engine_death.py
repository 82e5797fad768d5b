"""A replica's vLLM engine core dies alone, mid-answer (the colocated stack's `destructive` test:
it runs after every other test of that stack, which stops after it).

The replica itself lives on, so nothing breaks a connection: the engine's own app
answers the requests it held with an error (a 503, or a stream's error event).
A plain request's client has no byte yet (vLLM sends the whole answer at its end),
so Baton places it again on another replica, and greedy decoding gives the same
answer: the client never sees the death (deployments/front/pipeline/dispatch.py).
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.e2e import prompts
from tests.e2e.conftest import KEY_A
from tests.e2e.test_replica_death import _wait_engine_load

WAIT_S = 120

pytestmark = pytest.mark.usefixtures("destructive")


def test_a_plain_request_whose_engine_core_dies_mid_answer_gets_the_healthy_answer(colocated_stack):
    s = colocated_stack
    headers = {"authorization": f"Bearer {KEY_A}", "x-session-affinity": "sess-engine-death"}
    body = {"model": "baton-tiny", "messages": prompts.make("engine-death", 30), "max_tokens": 1500,
            "temperature": 0, "ignore_eos": True}
    healthy = httpx.post(f"{s.url}/v1/chat/completions", json=body, headers=headers, timeout=WAIT_S).json()
    victim = healthy["baton"]["decode_replica"]
    processes = s.replica_processes("decode", victim)
    assert len(processes) == 2, processes  # the replica and its engine core
    answer: dict = {}
    again = threading.Thread(target=lambda: answer.update(r=httpx.post(
        f"{s.url}/v1/chat/completions", json=body, headers=headers, timeout=WAIT_S)))
    sent = time.time()
    again.start()
    try:
        _wait_engine_load(s, victim, sent, 1)  # the victim's engine holds it (the session's pin)
        time.sleep(0.5)  # decoding: tokens computed, none sent
        assert again.is_alive(), "the answer must outlast the kill"
    finally:
        processes[1].kill()  # the engine core alone
    again.join(WAIT_S)
    r = answer["r"]
    assert r.status_code == 200, r.text
    baton = r.json()["baton"]
    assert baton["decode_replica"] != victim and baton["retried_after"], baton
    assert r.json()["choices"][0]["message"]["content"] == healthy["choices"][0]["message"]["content"]
    assert r.json()["usage"]["completion_tokens"] == healthy["usage"]["completion_tokens"] == 1500
