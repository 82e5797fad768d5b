"""The agent cases of test_agent_api.py: what agents ask of the OpenAI surface, through the
official client. Each returns what must be equal between Baton and `vllm serve`."""

from __future__ import annotations

import json

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
