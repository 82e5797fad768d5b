"""OpenAI request parsing: every bad body becomes APIError(400) naming the field."""

from __future__ import annotations

import json

import pytest

from deployments.schemas import APIError, ChatCompletionRequest, CompletionRequest, parse

MSG = [{"role": "user", "content": "hi"}]


def body(**kw) -> bytes:
    return json.dumps({"model": "m", "messages": MSG, **kw}).encode()


def test_valid_chat_request_with_text_parts():
    req = parse(ChatCompletionRequest, json.dumps({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        "max_tokens": 3, "temperature": 0, "stop": "x"}).encode())
    assert req.messages[0].text() == "ab"
    assert req.token_budget() == 3 and req.stop_list() == ["x"] and req.temperature == 0.0


@pytest.mark.parametrize("raw, param", [
    (b"{", None),
    (body(max_tokens=-1), "max_tokens"),
    (body(max_tokens="5"), "max_tokens"),
    (body(temperature="hot"), "temperature"),
    (body(top_p=0), "top_p"),
    (body(n=2), "n"),
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
    req = parse(ChatCompletionRequest, body(stop=["a", "b", "c", "d", "e"]))
    with pytest.raises(APIError):
        req.stop_list()


def test_completion_prompt_forms():
    assert parse(CompletionRequest, b'{"model": "m", "prompt": [1, 2]}').prompt == [1, 2]
    assert parse(CompletionRequest, b'{"model": "m", "prompt": "x"}').max_tokens == 16
