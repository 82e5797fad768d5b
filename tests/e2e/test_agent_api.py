"""The OpenAI surface agents use, through the official client, in both modes.

Each case runs greedy against Baton disaggregated (the shared stack), Baton
colocated (two routed replicas) and `vllm serve` on the same model with the
same tool-call parser,
and must give vLLM's answer: a forced tool call with JSON arguments, a
tool-result turn, a json_schema answer that parses, logprobs with
top_logprobs, n=2, and penalties that change the output.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.agent_cases import CASES
from tests.e2e.conftest import KEY_A


@pytest.fixture(scope="module")
def expected(vllm_answers):
    return vllm_answers["agent"]


@pytest.fixture(params=["disaggregated", "colocated"])
def baton_client(request):
    from openai import OpenAI

    stack = request.getfixturevalue("stack" if request.param == "disaggregated" else "colocated_stack")
    return OpenAI(base_url=f"{stack.url}/v1", api_key=KEY_A, max_retries=0, timeout=120)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_agent_case_matches_vllm_serve(baton_client, expected, case):
    assert case(baton_client) == expected[case.__name__]


def test_forced_tool_call_has_json_arguments(expected):
    name, args = expected["forced_tool_call"]
    assert name == "get_weather" and isinstance(args, dict) and set(args) == {"city"}


def test_keys_required_refuses_no_key_and_wrong_key(colocated_stack):
    """With `require_api_key`, a keyless request and a wrong key both get a 401 in OpenAI's shape."""
    import httpx

    body = {"model": "baton-tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    url = f"{colocated_stack.url}/v1/chat/completions"
    for headers in ({}, {"authorization": "Bearer wrong-key"}):
        r = httpx.post(url, json=body, headers=headers, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (headers, r.text)
    ok = httpx.post(url, json=body, headers={"authorization": f"Bearer {KEY_A}"}, timeout=60)
    assert ok.status_code == 200, ok.text


def test_routed_colocated_keeps_a_session_where_its_prefix_is(colocated_stack):
    """Each turn of a session runs on the replica that computed the turn before, and finds it cached;
    the index predicts exactly what that engine finds."""
    from tests.e2e import prompts
    from tests.e2e.test_routing import EVENTS_SETTLE_S, chat

    messages = prompts.make("colocated-session", 200)
    seen = []
    for turn in range(3):
        baton = chat(colocated_stack, messages, key=KEY_A, session="colocated-s1").json()["baton"]
        seen.append((baton["decode_replica"], baton["route"], baton["decode_only"],
                     baton["predicted_cached_tokens"], baton["decode_cached_tokens"]))
        messages = messages + [{"role": "assistant", "content": "ok"},
                               {"role": "user", "content": f"turn {turn} " + "more words " * 20}]
        time.sleep(EVENTS_SETTLE_S)
    replicas = {s[0] for s in seen}
    assert len(replicas) == 1, seen
    assert all(s[2] is True for s in seen) and seen[0][1] != "colocated", seen  # routed, never prefilled
    assert [s[1] for s in seen[1:]] == ["pinned", "pinned"], seen
    assert all(s[3] == s[4] > 0 for s in seen[1:]), seen
