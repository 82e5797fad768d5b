"""Engine chunks rendered as OpenAI responses and SSE events.

`Completion` accumulates the deltas of one request and renders either the
final JSON object or the stream's chunks. Kind "chat" speaks
chat.completion(.chunk); kind "text" speaks text_completion.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Literal

from actors.protocol import EngineChunk
from common.response import BatonInfo


def sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


@dataclass
class Completion:
    kind: Literal["chat", "text"]
    request_id: str
    model: str
    prompt_tokens: int
    created: int = field(default_factory=lambda: int(time.time()))
    started: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    text: str = ""
    completion_tokens: int = 0
    finish_reason: str | None = None
    token_ids: list[int] = field(default_factory=list)
    return_token_ids: bool = False
    # Baton extension in responses: route, replicas, predicted and actual hits.
    baton: BatonInfo = field(default_factory=BatonInfo)

    def add(self, chunk: EngineChunk) -> None:
        """Folds one engine delta into the totals."""
        if self.first_token_at is None and chunk.token_ids:
            self.first_token_at = time.monotonic()
        self.text += chunk.text
        self.completion_tokens += len(chunk.token_ids)
        self.token_ids.extend(chunk.token_ids)
        b = self.baton
        b.decode_cached_tokens = max(b.decode_cached_tokens, chunk.num_cached_tokens)
        if b.decode_replica is None:
            b.decode_replica = chunk.replica
        if chunk.finish_reason:
            self.finish_reason = chunk.finish_reason

    def usage(self) -> dict:
        """OpenAI usage, with `cached_tokens` as `BatonInfo.cached_tokens` counts them."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.baton.cached_tokens()},
        }

    def _envelope(self, obj: str) -> dict:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}

    def response(self) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": self.text},
                      "logprobs": None, "finish_reason": self.finish_reason}
            body = self._envelope("chat.completion")
        else:
            choice = {"index": 0, "text": self.text, "logprobs": None,
                      "finish_reason": self.finish_reason}
            body = self._envelope("text_completion")
        if self.return_token_ids:
            choice["token_ids"] = self.token_ids
        return {**body, "choices": [choice], "usage": self.usage(), "baton": self.baton.body()}

    def first_event(self) -> bytes | None:
        """The role-announcing chunk that opens a chat stream."""
        if self.kind != "chat":
            return None
        return sse({**self._envelope("chat.completion.chunk"), "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""},
             "logprobs": None, "finish_reason": None}]})

    def delta_event(self, chunk: EngineChunk) -> bytes:
        if self.kind == "chat":
            delta = {"content": chunk.text} if chunk.text else {}
            choice = {"index": 0, "delta": delta, "logprobs": None,
                      "finish_reason": chunk.finish_reason}
            if self.return_token_ids:
                choice["token_ids"] = chunk.token_ids
            return sse({**self._envelope("chat.completion.chunk"), "choices": [choice]})
        choice = {"index": 0, "text": chunk.text, "logprobs": None,
                  "finish_reason": chunk.finish_reason}
        if self.return_token_ids:
            choice["token_ids"] = chunk.token_ids
        return sse({**self._envelope("text_completion"), "choices": [choice]})

    def usage_event(self) -> bytes:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return sse({**self._envelope(obj), "choices": [], "usage": self.usage(), "baton": self.baton.body()})


def error_event(message: str, type_: str = "server_error", code: str | None = None) -> bytes:
    return sse({"error": {"message": message, "type": type_, "param": None, "code": code}})


DONE = sse("[DONE]")
