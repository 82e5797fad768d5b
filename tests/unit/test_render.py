"""OpenAI response and SSE rendering from engine chunks."""

from __future__ import annotations

import json

from actors.protocol import EngineChunk
from deployments.render import DONE, Completion


def chunks():
    return [EngineChunk("He", [5], None, 10, 8), EngineChunk("llo", [6, 7], "length", 10, 8)]


def test_chat_response_accumulates_usage_and_cached_tokens():
    c = Completion("chat", "id1", "m", prompt_tokens=10, return_token_ids=True)
    for ch in chunks():
        c.add(ch)
    r = c.response()
    assert r["object"] == "chat.completion"
    assert r["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["choices"][0]["token_ids"] == [5, 6, 7]
    assert r["usage"] == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
                          "prompt_tokens_details": {"cached_tokens": 8}}


def test_stream_events_are_sse_json():
    c = Completion("text", "id2", "m", prompt_tokens=10)
    assert c.first_event() is None
    ev = c.delta_event(chunks()[1])
    assert ev.startswith(b"data: ") and ev.endswith(b"\n\n")
    payload = json.loads(ev[6:])
    assert payload["choices"][0] == {"index": 0, "text": "llo", "logprobs": None, "finish_reason": "length"}
    assert DONE == b"data: [DONE]\n\n"
