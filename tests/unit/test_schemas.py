"""OpenAI request parsing: every bad body becomes APIError(400) naming the field."""

from __future__ import annotations

import json

import pytest

from deployments.api.schemas import APIError, ChatCompletionRequest, CompletionRequest, parse

MSG = [{"role": "user", "content": "hi"}]


def body(**kw) -> bytes:
    return json.dumps({"model": "m", "messages": MSG, **kw}).encode()


def test_valid_chat_request_with_text_parts():
    req = parse(ChatCompletionRequest, json.dumps({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        "max_tokens": 3, "temperature": 0, "stop": "x"}).encode())
    assert [p.text for p in req.messages[0].content] == ["a", "b"]
    assert req.max_tokens == 3 and req.stop == "x" and req.temperature == 0.0


def test_agent_requests_parse():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    req = parse(ChatCompletionRequest, json.dumps({"model": "m", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
        "tools": tools, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}},
        "logprobs": True, "top_logprobs": 2, "n": 2, "presence_penalty": 1.5}).encode())
    assert req.tools[0].function.name == "get_weather" and req.n == 2
    assert req.response_format.json_schema.schema_ == {"type": "object"}


@pytest.mark.parametrize("raw, param", [
    (b"{", None),
    (body(max_tokens=-1), "max_tokens"),
    (body(max_tokens="5"), "max_tokens"),
    (body(temperature="hot"), "temperature"),
    (body(top_p=0), "top_p"),
    (body(n=0), "n"),
    (body(top_logprobs=21), "top_logprobs"),
    (body(tools=[{"type": "retrieval"}]), "tools.0.type"),
    (body(tool_choice="sometimes"), "tool_choice"),
    (body(response_format={"type": "yaml"}), "response_format.type"),
    (json.dumps({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}).encode(), "messages.0.role"),
    (body(foo=1), "foo"),
    (json.dumps({"model": "m"}).encode(), "messages"),
    (json.dumps({"model": "m", "messages": "hi"}).encode(), "messages"),
])
def test_bad_chat_bodies(raw, param):
    with pytest.raises(APIError) as exc:
        parse(ChatCompletionRequest, raw)
    assert exc.value.status == 400
    assert exc.value.param == param
    assert exc.value.body()["error"]["type"] == "invalid_request_error"


def test_too_many_stops():
    with pytest.raises(APIError) as exc:
        parse(ChatCompletionRequest, body(stop=["a", "b", "c", "d", "e"]))
    assert exc.value.param == "stop"


def test_completion_prompt_forms():
    assert parse(CompletionRequest, b'{"model": "m", "prompt": [1, 2]}').prompt == [1, 2]
    assert parse(CompletionRequest, b'{"model": "m", "prompt": "x"}').max_tokens == 16
    for bad in (b'{"model": "m", "prompt": [1, -3]}', b'{"model": "m", "prompt": []}'):
        with pytest.raises(APIError):
            parse(CompletionRequest, bad)
