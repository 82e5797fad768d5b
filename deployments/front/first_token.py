"""Disaggregated streams whose first token is the prefill engine's.

A prefill engine samples one token after computing the prompt. Without this
module that token is thrown away: the client waits for the prefill, the KV
save, the decode engine's load and its first step. With it (as SGLang's and
Dynamo's disaggregated paths do) the front streams the prefill's token the
moment it exists, and the decode engine continues from prompt + that token:

- `eligible` says whether a request's answer is fully determined by the
  prompt, plain sampling settings and the token stream, so that splitting
  it after one token changes nothing a client can see. Everything else
  (tools, structured output, logprobs, `n`, penalties that count output
  tokens, stop strings, seeds, ...) takes the two-step path unchanged;
- `sampling` is what the prefill engine needs to sample that token as the
  decode engine would have;
- `usable` says whether the token can be sent as it is (a stop token, or
  text that is not yet whole UTF-8, falls back to the two-step path);
- `continue_body` turns the request into the decode engine's continuation;
- `first_events` renders the two SSE events vLLM would have sent first.

The decode replica's Finisher drops its own role event and reports usage
as one request (actors/finisher.py).
"""

from __future__ import annotations

import time

# Request fields whose effect is the same whether the first token is sampled
# by the prefill engine or by the decode engine (checked further in `eligible`).
_PLAIN = frozenset({
    "model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "ignore_eos", "user",
    "n", "presence_penalty", "frequency_penalty", "logprobs", "tool_choice",
    "cache_salt", "request_id", "kv_transfer_params",  # set by the front
})
# Sampling fields the prefill engine applies (the rest of `_PLAIN` cannot change one token).
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "ignore_eos")


def eligible(kind: str, body: dict) -> bool:
    """Whether `body` (a chat request as the front will forward it) may take its
    first token from the prefill engine; changes nothing."""
    if kind != "chat" or body.get("stream") is not True or not _PLAIN.issuperset(body):
        return False
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not {"include_usage"}.issuperset(options):
        return False
    if body.get("n") not in (None, 1) or body.get("logprobs") not in (None, False):
        return False
    if any(body.get(k) not in (None, 0, 0.0) for k in ("presence_penalty", "frequency_penalty")):
        return False
    if body.get("tool_choice") not in (None, "none"):
        return False
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    return limit is None or (isinstance(limit, int) and limit >= 2)


def sampling(body: dict) -> dict:
    """The request's own sampling fields for the prefill engine (unset ones omitted:
    the engine fills in the model's defaults, as vLLM's server does)."""
    return {k: body[k] for k in SAMPLING if body.get(k) is not None}


def usable(token: dict) -> bool:
    """Whether the prefill's token (`{"token_id", "text", "finish_reason"}`) can be
    streamed as the answer's first: the answer goes on after it, and its text is
    whole (an incomplete UTF-8 sequence detokenises to "" or U+FFFD)."""
    text = token.get("text")
    return (token.get("finish_reason") == "length" and isinstance(text, str) and text != ""
            and "\ufffd" not in text and isinstance(token.get("token_id"), int))


def continue_body(body: dict, prompt_ids: list[int], token_id: int) -> None:
    """Changes `body` into the decode engine's part: the prompt grows by the first
    token and the output limit shrinks by one."""
    body["kv_transfer_params"] = {**(body.get("kv_transfer_params") or {}),
                                  "prompt_token_ids": [*prompt_ids, token_id]}
    for key in ("max_tokens", "max_completion_tokens"):
        if body.get(key) is not None:
            body[key] -= 1


def first_events(request_id: str, model: str, text: str, created: int | None = None) -> bytes:
    """vLLM's first two chat stream events, rendered by vLLM's own classes: the
    assistant role, then the first token's text."""
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionResponseStreamChoice,
        ChatCompletionStreamResponse,
    )
    from vllm.entrypoints.generate.base.protocol import DeltaMessage

    created = int(time.time()) if created is None else created
    out = []
    for delta, first in ((DeltaMessage(role="assistant", content=""), True), (DeltaMessage(content=text), False)):
        # The fields vLLM sets explicitly (to None) appear as nulls, as in its own events.
        choice = ChatCompletionResponseStreamChoice(index=0, delta=delta, logprobs=None, finish_reason=None,
                                                    **({} if first else {"token_ids": None}))
        chunk = ChatCompletionStreamResponse(id=request_id, object="chat.completion.chunk", created=created,
                                             choices=[choice], model=model,
                                             **({"prompt_token_ids": None, "prompt_text": None} if first else {}))
        out.append(f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n")
    return "".join(out).encode()
