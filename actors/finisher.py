"""ASGI middleware around vLLM's OpenAI app: what Baton adds to its answers.

On the routes that generate (FINISHED_PATHS: chat completions, completions,
Responses, Anthropic Messages) it
- adds the `baton` object (common.response.BatonInfo) to a JSON answer and to
  every stream event that carries `usage`, with what the routing front sent
  in the `x-baton-info` header plus this replica's id and its engine's hit;
- reports the cached prompt tokens as Baton counts them (the prefill
  engine's hit when a prefill ran) in each API's own terms: chat's
  `prompt_tokens_details.cached_tokens`, Responses'
  `input_tokens_details.cached_tokens`, Anthropic's `cache_read_input_tokens`
  (with `input_tokens` the rest of the prompt);
- turns vLLM's error bodies into OpenAI's (`type` invalid_request_error and a
  string `code` such as context_length_exceeded or model_not_found); the
  Messages route's are already Anthropic's.

Each answer that reports usage reaches `on_usage(info, usage, tenant, model)`
once, with the `usage` object as the client receives it (a stream's last
one), and the tenant and model the front sent in `x-baton-tenant` and
`x-baton-model`: the usage counters a bill is built on
(deployments/front/metrics.py). The front asks vLLM for usage on every stream;
`x-baton-hide-usage: 1` says its client did not ask, so the usage-only
chunk (`"choices":[]`) is counted but not sent, and the chunks that end a
choice get back the `system_fingerprint` vLLM puts on them only when it
sends no usage chunk (they are held until that chunk, which follows them).

Stream chunks without `usage` pass through as bytes: only a chunk that
contains the bytes `"usage":{` is parsed. When the front already streamed
the prefill engine's first token (deployments/front/first_token.py), the stream's
role event is dropped and usage counts that token as output. A stream its
engine died in ends with Baton's `engine_unavailable` error event, not vLLM's
"see stack trace (above)" 500. The request's `decode` span (and
`kv_load`, up to the first answer bytes) continues the front's trace.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Callable
from urllib.parse import quote, unquote

from pydantic_core import from_json, to_json  # a third of json's time for an answer's round trip (~3 us for 750 bytes)

from common import tracing
from common.constants import ENGINE_GONE, REQUEST_ID_HEADER
from common.response import BatonInfo

COMPLETION_PATHS = ("/v1/chat/completions", "/v1/completions")
# Every path whose answers carry usage, and the API's shape of it.
FINISHED_PATHS = {"/v1/chat/completions": "chat", "/v1/completions": "text", "/v1/responses": "responses",
                  "/v1/messages": "messages"}
INFO_HEADER = b"x-baton-info"
# Set by the front on every completion it forwards (a client's own copies are dropped):
TENANT_HEADER = b"x-baton-tenant"  # the tenant, percent-encoded
MODEL_HEADER = b"x-baton-model"  # the model the client asked for, percent-encoded
HIDE_USAGE_HEADER = b"x-baton-hide-usage"  # "1": a stream whose client did not ask for usage
USAGE_HEADERS = (TENANT_HEADER, MODEL_HEADER, HIDE_USAGE_HEADER)
_USAGE = b'"usage":{'
_ROLE = b'"delta":{"role":"assistant","content":""}'
_FINISHED = b'"finish_reason":"'  # a chunk that ends a choice
_FINGERPRINT = b'"system_fingerprint":'
_ERROR_EVENT = b'data: {"error"'
_ENGINE_DEAD = b"EngineCore encountered an issue"  # vLLM's EngineDeadError, as its stream error event says it
ENGINE_STOPPED_EVENT = b"data: " + json.dumps({"error": {
    **ENGINE_GONE["error"], "message": "the model's engine stopped mid-answer; the stream ends here"}}).encode() + b"\n\n"
_INFO_FIELDS = {f.name for f in fields(BatonInfo)}
_REQUEST_ID = REQUEST_ID_HEADER.encode()


def header(headers: list[tuple[bytes, bytes]], name: bytes) -> str:
    """The value of ASGI header `name` (lower-case bytes), or ""."""
    return next((v.decode("latin-1") for k, v in headers if k == name), "")


def _text(headers: dict[bytes, bytes], name: bytes) -> str:
    """`header`'s value from headers already in a dict."""
    return headers.get(name, b"").decode("latin-1")


def read_info(headers: dict[bytes, bytes]) -> BatonInfo:
    """The BatonInfo the front sent in `x-baton-info` (empty if none or bad), from headers in a dict."""
    raw = headers.get(INFO_HEADER)
    if raw is not None:
        try:
            return BatonInfo(**{k: v for k, v in json.loads(raw).items() if k in _INFO_FIELDS})
        except (ValueError, TypeError, AttributeError):
            pass
    return BatonInfo()


def ask_usage(body: dict) -> bool:
    """Makes a streamed request's `body` ask vLLM for usage; True when its client
    had not asked (the Finisher then hides the usage chunk). Changes `body`."""
    if body.get("stream") is not True:
        return False
    if (body.get("stream_options") or {}).get("include_usage") is True:
        return False
    # continuous_usage_stats does nothing without include_usage: left out, as for the client.
    body["stream_options"] = {"include_usage": True}
    return True


def usage_headers(tenant: str, model: str, hide: bool) -> list[tuple[bytes, bytes]]:
    """The headers that tell the Finisher whose answer it finishes (USAGE_HEADERS)."""
    return [(TENANT_HEADER, quote(tenant, safe="").encode()), (MODEL_HEADER, quote(model, safe="").encode()),
            (HIDE_USAGE_HEADER, b"1" if hide else b"0")]


def openai_error(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    """An OpenAI-style error body."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 429:
        kind = "rate_limit_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_code(status: int, message: str) -> str | None:
    """OpenAI's string code for one of vLLM's error messages, if it has one."""
    if "maximum context length" in message or "max_model_len" in message:
        return "context_length_exceeded"
    if status == 404 and "model" in message.lower():
        return "model_not_found"
    return None


def normalize_error(status: int, body: dict) -> dict:
    """vLLM's {"error": {"type": "BadRequestError", "code": 400, ...}} as OpenAI's."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return openai_error(status, str(body)[:500])
    message = str(err.get("message", ""))
    code = err.get("code") if isinstance(err.get("code"), str) else error_code(status, message)
    return openai_error(status, message, code, err.get("param"))


def _counted(prompt: int, completion: int, cached: int) -> dict:
    """Usage in the chat shape the counters read (deployments/front/metrics.py record_usage)."""
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _finish_responses(obj: dict, info: BatonInfo) -> dict | None:
    target = obj["response"] if isinstance(obj.get("response"), dict) else obj  # a stream event wraps it
    usage = target.get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("input_tokens_details") or {}
    info.decode_cached_tokens = int(details.get("cached_tokens") or 0)
    usage["input_tokens_details"] = {**details, "cached_tokens": info.cached_tokens()}
    target["baton"] = info.body()
    return _counted(int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0), info.cached_tokens())


def _finish_messages(obj: dict, info: BatonInfo) -> dict | None:
    """Anthropic's usage: input_tokens leaves out what was read from cache or written to it."""
    target = obj["message"] if isinstance(obj.get("message"), dict) else obj  # message_start wraps it
    usage = target.get("usage")
    if not isinstance(usage, dict):
        return None
    created = int(usage.get("cache_creation_input_tokens") or 0)
    read = int(usage.get("cache_read_input_tokens") or 0)
    total = int(usage.get("input_tokens") or 0) + read + created
    info.decode_cached_tokens = read
    usage["cache_read_input_tokens"] = cached = info.cached_tokens()
    usage["input_tokens"] = max(0, total - cached - created)
    target["baton"] = info.body()
    return _counted(total, int(usage.get("output_tokens") or 0), cached)


def finish_usage(obj: dict, info: BatonInfo, kind: str = "chat") -> dict | None:
    """Sets the cached prompt tokens as Baton counts them and adds `baton`, in the usage
    shape of API `kind` (FINISHED_PATHS); changes `obj` and `info`. Returns the usage in
    the chat shape, for the counters; None without usage.

    When the prefill sampled the first token (chat only), this engine's prompt held it:
    it is counted back as a completion token."""
    if kind == "responses":
        return _finish_responses(obj, info)
    if kind == "messages":
        return _finish_messages(obj, info)
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    if info.first_token == "prefill" and usage.get("prompt_tokens"):
        usage["prompt_tokens"] -= 1
        usage["completion_tokens"] = int(usage.get("completion_tokens") or 0) + 1
    details = usage.get("prompt_tokens_details") or {}
    info.decode_cached_tokens = int(details.get("cached_tokens") or 0)
    usage["prompt_tokens_details"] = {**details, "cached_tokens": info.cached_tokens()}
    obj["baton"] = info.body()
    return usage


def _drop_role(chunk: bytes) -> bytes:
    """The chunk without vLLM's assistant-role event, which the front already sent."""
    if _ROLE not in chunk:
        return chunk
    return b"\n\n".join(e for e in chunk.split(b"\n\n") if not (e.startswith(b"data: {") and _ROLE in e))


def _stamp(event: bytes, fingerprint) -> bytes:
    """A chunk that ends a choice with vLLM's `system_fingerprint`, as vLLM stamps it
    on those chunks when it sends no usage chunk."""
    if not isinstance(fingerprint, str) or _FINISHED not in event or _FINGERPRINT in event \
            or not event.endswith(b"}"):
        return event
    return event[:-1] + b"," + _FINGERPRINT + json.dumps(fingerprint).encode() + b"}"


class Finisher:
    """Wraps vLLM's ASGI app; see the module docstring for what it changes."""

    def __init__(self, app, replica: str, on_usage: Callable[[BatonInfo, dict, str, str], None] | None = None):
        """`on_usage(info, usage, tenant, model)` runs once per answer that reported usage."""
        self.app, self.replica, self.on_usage = app, replica, on_usage

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] not in FINISHED_PATHS:
            return await self.app(scope, receive, send)
        headers = dict(reversed(scope["headers"]))  # one pass; the first of a repeated header wins, as in `header`
        info = read_info(headers)
        info.decode_replica = self.replica
        tracer = tracing.tracer()
        span = tracer.start_span("decode", context=tracing.extract({"traceparent": _text(headers, b"traceparent")}))
        kv = tracer.start_span("kv_load", context=tracing.context_of(span))
        request_id = _text(headers, _REQUEST_ID)
        for s in (span, kv):
            s.set_attribute("baton.request_id", request_id)
            s.set_attribute("baton.replica", self.replica)
        finishing = _FinishingSend(send, info, kv, hide_usage=headers.get(HIDE_USAGE_HEADER) == b"1",
                                   kind=FINISHED_PATHS[scope["path"]])
        try:
            await self.app(scope, receive, finishing)
        finally:
            finishing.end_kv()
            if self.on_usage is not None and finishing.usage is not None:
                self.on_usage(info, finishing.usage, unquote(_text(headers, TENANT_HEADER)) or "unknown",
                              unquote(_text(headers, MODEL_HEADER)) or "unknown")
            span.set_attribute("baton.cached_tokens", info.decode_cached_tokens)
            span.end()


class _FinishingSend:
    """The `send` handed to vLLM's app: rewrites what Finisher changes."""

    def __init__(self, send, info: BatonInfo, kv_span, hide_usage: bool = False, kind: str = "chat"):
        self.send, self.info, self.kv_span, self.kind = send, info, kv_span, kind
        self.usage: dict | None = None  # the answer's (last) usage as sent, once seen
        self.hide_usage = hide_usage
        self.held: list[bytes] = []  # hidden usage: events from the first end of a choice on
        self.start: dict | None = None
        self.mode = "pass"  # pass | sse | json
        self.buffer: list[bytes] = []
        self.drop_role = info.first_token == "prefill"  # the front sent the role event

    async def __call__(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            ctype = next((v for k, v in headers if k == b"content-type"), b"")
            self.mode = "sse" if ctype.startswith(b"text/event-stream") else (
                "json" if ctype.startswith(b"application/json") else "pass")
            self.start = {**message, "headers": headers}
            if self.mode != "json":
                await self.send(self.start)
            return
        if message["type"] != "http.response.body":
            return await self.send(message)
        body = message.get("body", b"")
        if body:
            self.end_kv()
        if self.mode == "sse":
            if self.drop_role and body:  # vLLM's first event is the role
                body, self.drop_role = _drop_role(body), False
                message = {**message, "body": body}
            if body.startswith(_ERROR_EVENT) and _ENGINE_DEAD in body:
                message = {**message, "body": ENGINE_STOPPED_EVENT + body.partition(b"\n\n")[2]}
            elif _USAGE in body or (self.hide_usage and (self.held or _FINISHED in body)):
                message = {**message, "body": self._finish_sse(body)}
            if self.held and not message.get("more_body"):  # no usage chunk came: sent as they are
                message = {**message, "body": message.get("body", b"") + b"".join(e + b"\n\n" for e in self.held)}
                self.held = []
            return await self.send(message)
        if self.mode == "pass":
            return await self.send(message)
        self.buffer.append(body)
        if message.get("more_body"):
            return
        await self._send_json(b"".join(self.buffer))

    def _finish_sse(self, chunk: bytes) -> bytes:
        """The chunk with its usage events finished; a hidden usage chunk is
        counted, dropped, and releases the held events (see the module docstring)."""
        *events, rest = chunk.split(b"\n\n")
        out = []
        for event in events:
            head, sep, data = event.rpartition(b"data: ")  # Anthropic's events name themselves first
            if _USAGE in event and data.startswith(b"{") and (not head or head.endswith(b"\n")):
                obj = from_json(data)
                if (usage := finish_usage(obj, self.info, self.kind)) is not None:
                    self.usage = usage
                if self.hide_usage and obj.get("choices") == []:
                    out += [_stamp(e, obj.get("system_fingerprint")) for e in self.held]
                    self.held = []
                    continue
                event = head + sep + to_json(obj)
            elif self.hide_usage and (self.held or _FINISHED in event):
                self.held.append(event)
                continue
            out.append(event)
        return b"".join(e + b"\n\n" for e in out) + rest

    def end_kv(self) -> None:
        """Ends the kv_load span (KV loaded, prompt tail computed) once."""
        if self.kv_span is not None:
            self.kv_span.end()
            self.kv_span = None

    async def _send_json(self, raw: bytes) -> None:
        status = self.start["status"]
        try:
            obj = from_json(raw)
        except ValueError:
            obj = None
        if obj is not None:
            if status >= 400:
                obj = obj if self.kind == "messages" else normalize_error(status, obj)  # Anthropic's own shape
            elif (usage := finish_usage(obj, self.info, self.kind)) is not None:
                self.usage = usage
            raw = to_json(obj)
        headers = [(k, v) for k, v in self.start["headers"] if k != b"content-length"]
        headers.append((b"content-length", str(len(raw)).encode()))
        await self.send({**self.start, "headers": headers})
        await self.send({"type": "http.response.body", "body": raw, "more_body": False})
