"""Which disaggregated requests take their first token from the prefill engine,
and how the front begins and the decode replica continues their streams."""

from __future__ import annotations

import asyncio
import json

import pytest

from actors.finisher import Finisher
from deployments.front import first_token, relay

BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "cache_salt": "t", "request_id": "abc", "kv_transfer_params": {"prompt_token_ids": [1, 2]}}


@pytest.mark.parametrize("extra", [
    {}, {"max_tokens": 2}, {"stream_options": {"include_usage": True}}, {"temperature": 0.7, "top_p": 0.9},
    {"n": 1, "logprobs": False, "presence_penalty": 0, "frequency_penalty": 0.0, "tool_choice": "none"},
    {"ignore_eos": True, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "user": "u"},
])
def test_plain_streamed_chat_is_eligible(extra):
    assert first_token.eligible("chat", {**BASE, **extra})


@pytest.mark.parametrize("extra", [
    {"stream": False}, {"max_tokens": 1}, {"max_completion_tokens": 1}, {"n": 2}, {"logprobs": True},
    {"presence_penalty": 0.5}, {"frequency_penalty": -1}, {"tools": [{"type": "function"}]},
    {"tool_choice": "required"}, {"response_format": {"type": "json_object"}}, {"stop": ["x"]},
    {"seed": 1}, {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    {"min_tokens": 3}, {"logit_bias": {"1": 5}}, {"echo": True},
])
def test_anything_the_split_could_change_takes_the_two_step_path(extra):
    assert not first_token.eligible("chat", {**BASE, **extra})
    assert not first_token.eligible("text", BASE)


def test_sampling_carries_only_the_request_fields_it_set():
    body = {**BASE, "temperature": 0.0, "top_p": None, "ignore_eos": True, "max_tokens": 9}
    assert first_token.sampling(body) == {"temperature": 0.0, "ignore_eos": True}


@pytest.mark.parametrize("token,ok", [
    ({"token_id": 5, "text": " a", "finish_reason": "length"}, True),
    ({"token_id": 5, "text": " a", "finish_reason": "stop"}, False),  # EOS: the answer ends here
    ({"token_id": 5, "text": "", "finish_reason": "length"}, False),  # half a UTF-8 character
    ({"token_id": 5, "text": "\ufffd", "finish_reason": "length"}, False),
    ({"token_id": None, "text": "a", "finish_reason": "length"}, False),
])
def test_a_token_is_streamed_only_when_whole_and_not_the_end(token, ok):
    assert first_token.usable(token) is ok


def test_decode_continues_after_the_token_with_one_token_less():
    body = {**BASE, "max_tokens": 8, "max_completion_tokens": 8}
    first_token.continue_body(body, [1, 2], 7)
    assert body["kv_transfer_params"]["prompt_token_ids"] == [1, 2, 7]
    assert body["max_tokens"] == body["max_completion_tokens"] == 7
    unbounded = dict(BASE)
    first_token.continue_body(unbounded, [1, 2], 7)
    assert "max_tokens" not in unbounded


def test_first_events_are_the_role_then_the_text():
    events = first_token.first_events("chatcmpl-abc", "m", " hi", created=5).split(b"\n\n")
    role, text = (json.loads(e[6:]) for e in events[:2])
    assert role["id"] == text["id"] == "chatcmpl-abc" and role["created"] == 5
    assert role["object"] == "chat.completion.chunk" and role["model"] == "m"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert text["choices"][0]["delta"] == {"content": " hi"}
    assert events[2:] == [b""]


def _finished(chunks: list[bytes], info: dict) -> list[bytes]:
    sent = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        for c in chunks:
            await send({"type": "http.response.body", "body": c, "more_body": True})

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST",
             "headers": [(b"x-baton-info", json.dumps(info).encode())]}
    asyncio.run(Finisher(app, "d")(scope, receive, send))
    return [m["body"] for m in sent[1:]]


ROLE = b'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null}]}\n\n'
TEXT = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"b"}}]}\n\n'
USAGE = (b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":3,"total_tokens":14}}'
         b'\n\ndata: [DONE]\n\n')


def test_decode_drops_its_role_event_and_counts_the_first_token_as_output():
    out = _finished([ROLE, TEXT, USAGE], {"first_token": "prefill", "prefill_cached_tokens": 0})
    assert out[0] == b"" and out[1] == TEXT
    usage = json.loads(out[2].split(b"\n\n")[0][6:])
    assert usage["usage"]["prompt_tokens"] == 10 and usage["usage"]["completion_tokens"] == 4
    assert usage["usage"]["total_tokens"] == 14 and usage["baton"]["first_token"] == "prefill"


def test_without_the_prefill_token_decode_answers_unchanged():
    out = _finished([ROLE, TEXT, USAGE], {})
    assert out[:2] == [ROLE, TEXT]
    assert json.loads(out[2].split(b"\n\n")[0][6:])["usage"]["prompt_tokens"] == 11


def _early(messages: list[dict]) -> list[dict]:
    sent = []

    async def send(message):
        sent.append(message)

    async def go():
        stream = relay.EarlyStream(send, [(b"x-baton-request-id", b"chatcmpl-abc")])
        await stream.begin(b"data: first\n\n")
        for m in messages:
            await stream(m)

    asyncio.run(go())
    return sent


def test_an_early_stream_drops_the_answers_start_and_passes_its_events():
    sent = _early([{"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"x")]},
                   {"type": "http.response.body", "body": TEXT, "more_body": True},
                   {"type": "http.response.body", "body": b"", "more_body": False}])
    assert [m["type"] for m in sent] == ["http.response.start"] + ["http.response.body"] * 3
    assert dict(sent[0]["headers"])[b"content-type"].startswith(b"text/event-stream")
    assert dict(sent[0]["headers"])[b"x-baton-request-id"] == b"chatcmpl-abc"
    assert [m["body"] for m in sent[1:]] == [b"data: first\n\n", TEXT, b""]


def test_an_error_answer_after_the_first_token_ends_the_stream_with_an_error_event():
    err = json.dumps({"error": {"message": "boom", "type": "server_error", "param": None, "code": None}}).encode()
    sent = _early([{"type": "http.response.start", "status": 503, "headers": []},
                   {"type": "http.response.body", "body": err[:10], "more_body": True},
                   {"type": "http.response.body", "body": err[10:], "more_body": False}])
    assert sent[0]["status"] == 200 and len(sent) == 3
    last = sent[2]["body"].split(b"\n\n")
    assert json.loads(last[0][6:])["error"]["message"] == "boom" and last[1] == b"data: [DONE]"
    assert sent[2]["more_body"] is False
