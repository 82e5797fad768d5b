"""Bad input gets a 4xx with an OpenAI-style error body, never a 5xx or a hang."""

from __future__ import annotations

import httpx
import pytest

CHAT = "/v1/chat/completions"
OK_MSG = [{"role": "user", "content": "hi"}]
CASES = {
    "invalid json": (CHAT, b'{"model": "baton-tiny", "messages": [', 400),
    "empty body": (CHAT, b"", 400),
    "json not an object": (CHAT, b"[1, 2]", 400),
    "unknown model": (CHAT, {"model": "gpt-9", "messages": OK_MSG}, 404),
    "missing messages": (CHAT, {"model": "baton-tiny"}, 400),
    "empty messages": (CHAT, {"model": "baton-tiny", "messages": []}, 400),
    "negative max_tokens": (CHAT, {"model": "baton-tiny", "messages": OK_MSG, "max_tokens": -5}, 400),
    "max_tokens as string": (CHAT, {"model": "baton-tiny", "messages": OK_MSG, "max_tokens": "ten"}, 400),
    "messages as string": (CHAT, {"model": "baton-tiny", "messages": "hello"}, 400),
    "temperature as string": (CHAT, {"model": "baton-tiny", "messages": OK_MSG, "temperature": "hot"}, 400),
    "bad role": (CHAT, {"model": "baton-tiny", "messages": [{"role": "wizard", "content": "x"}]}, 400),
    "unknown field": (CHAT, {"model": "baton-tiny", "messages": OK_MSG, "frobnicate": 1}, 400),
    "prompt longer than context": (
        CHAT, {"model": "baton-tiny", "messages": [{"role": "user", "content": "word " * 5000}]}, 400),
    "completion past context": (
        CHAT, {"model": "baton-tiny", "messages": OK_MSG, "max_tokens": 4096}, 400),
    "completions without prompt": ("/v1/completions", {"model": "baton-tiny"}, 400),
    "completions bad token id": ("/v1/completions", {"model": "baton-tiny", "prompt": [1, -3]}, 400),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_request_gets_openai_style_4xx(stack, case):
    path, body, status = CASES[case]
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(f"{stack.url}{path}", headers={"content-type": "application/json"},
                   timeout=30, **kwargs)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error"


def test_openai_client_raises_typed_errors(client):
    import openai

    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=OK_MSG)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="baton-tiny", messages=OK_MSG, max_tokens=10**6)
    assert exc.value.code == "context_length_exceeded"
