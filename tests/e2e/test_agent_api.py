"""The OpenAI surface agents use, through the official client, in both modes.

Each case runs greedy against Baton disaggregated (the shared stack), Baton
colocated (two routed replicas) and `vllm serve` on the same model with the
same tool-call parser,
and must give vLLM's answer: a forced tool call with JSON arguments, a
tool-result turn, a json_schema answer that parses, logprobs with
top_logprobs, n=2, and penalties that change the output.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.conftest import KEY_A

# Bounded schemas: the tiny model's free text holds control characters that
# a grammar may let into a JSON string, which strict JSON then rejects.
CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
        "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": CITY}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
FORCED = {"type": "function", "function": {"name": "get_weather"}}
TOOL_TURN = ASK + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["sunny", "rain"]},
                                           "sure": {"type": "boolean"}},
          "required": ["answer", "sure"], "additionalProperties": False}


def _create(client, **kw):
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model="baton-tiny", **kw)


def forced_tool_call(client):
    msg = _create(client, messages=ASK, tools=TOOLS, tool_choice=FORCED, max_tokens=40).choices[0].message
    call = msg.tool_calls[0]
    return call.function.name, json.loads(call.function.arguments)


def tool_result_turn(client):
    return _create(client, messages=TOOL_TURN, tools=TOOLS, max_tokens=12).choices[0].message.content


def json_schema_answer(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    return json.loads(_create(client, messages=ASK, response_format=fmt, max_tokens=200)
                      .choices[0].message.content)


def logprobs(client):
    choice = _create(client, messages=ASK, logprobs=True, top_logprobs=2, max_tokens=6).choices[0]
    assert all(len(t.top_logprobs) == 2 for t in choice.logprobs.content)
    return [(t.token, [a.token for a in t.top_logprobs]) for t in choice.logprobs.content]


def two_choices(client):
    # vLLM refuses n > 1 under greedy decoding; seeded sampling is as reproducible.
    resp = _create(client, messages=ASK, n=2, max_tokens=6, temperature=1.0, seed=7)
    assert [c.index for c in resp.choices] == [0, 1]
    return [c.message.content for c in resp.choices]


def penalties(client):
    # Seeded sampling: the tiny model's greedy margins are wider than any penalty. Past its end of
    # answer (ignore_eos), so that there are repeats for the penalties to act on.
    more = {"ignore_eos": True}
    plain = _create(client, messages=ASK, max_tokens=40, temperature=1.0, seed=11,
                    extra_body=more).choices[0].message.content
    penalised = _create(client, messages=ASK, max_tokens=40, temperature=1.0, seed=11, presence_penalty=2.0,
                        frequency_penalty=2.0, extra_body=more).choices[0].message.content
    assert plain != penalised
    return penalised


CASES = [forced_tool_call, tool_result_turn, json_schema_answer, logprobs, two_choices, penalties]


@pytest.fixture(scope="module")
def vllm_serve(stack):
    from bench.common.peers import VllmServe
    from common.config import load_config

    with VllmServe(load_config(stack.config), stack.config.parent / "vllm-serve.log") as server:
        yield server


@pytest.fixture(scope="module")
def expected(vllm_serve):
    from openai import OpenAI

    client = OpenAI(base_url=f"{vllm_serve.url}/v1", api_key="unused", max_retries=0, timeout=120)
    return {case.__name__: case(client) for case in CASES}


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
