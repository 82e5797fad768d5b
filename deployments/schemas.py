"""OpenAI request schemas and the error type every bad request becomes.

Requests are validated strictly from JSON: a string where a number belongs,
an unknown field, a negative max_tokens or an empty message list is a 400
with an OpenAI-style body, never a 5xx.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class APIError(Exception):
    """An error answered to the client as `{"error": {...}}` with `status`."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type_
        self.param, self.code, self.headers = param, code, headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(_Request):
    include_usage: bool = False


class _Sampling(_Request):
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = Field(None)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1, description="only one choice per request")
    user: str | None = None
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    return_token_ids: bool = Field(False, description="Baton extension: add `token_ids` to choices")
    ignore_eos: bool = Field(False, description="vLLM extension: generate exactly max_tokens")

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        if len(stops) > 4:
            raise APIError(400, "at most 4 stop sequences are allowed", param="stop")
        return [s for s in stops if s]


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    def token_budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str]
    max_tokens: int | None = Field(16, ge=1)

    def token_budget(self) -> int | None:
        return self.max_tokens


def parse(model: type[_Request], body: bytes) -> _Request:
    """Validates a JSON body; raises APIError(400) naming the first bad field."""
    if not body.strip():
        raise APIError(400, "request body is empty; expected a JSON object")
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        if err["type"] == "json_invalid":
            raise APIError(400, f"invalid JSON body: {err['msg']}") from None
        loc = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            msg = f"Unrecognized request argument supplied: {loc}"
        elif err["type"] == "missing":
            msg = f"Missing required parameter: '{loc}'"
        else:
            msg = f"Invalid value for '{loc}': {err['msg']}"
        raise APIError(400, msg, param=loc or None) from None


def _inline(node, defs: dict):
    if isinstance(node, dict):
        if "$ref" in node:
            return _inline(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        return {k: _inline(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}


def openapi_operation(model: type[BaseModel]) -> dict:
    """OpenAPI request body and responses for a route that parses `model` itself.

    The routes read the raw body (so that bad JSON becomes a clean 400), which
    hides the schema from FastAPI; this puts it back for clients and fuzzers.
    """
    schema = model.model_json_schema()
    body = _inline(schema, schema.get("$defs", {}))
    error = {"content": {"application/json": {"schema": ERROR_SCHEMA}}}
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {
            "200": {"description": "completion (JSON, or SSE when stream=true)", "content": {
                "application/json": {"schema": {"type": "object", "required": ["id", "choices"]}},
                "text/event-stream": {"schema": {"type": "string"}}}},
            **{code: {"description": desc, **error} for code, desc in [
                ("400", "invalid request"), ("401", "bad API key"), ("404", "unknown model"),
                ("429", "shed: retry after Retry-After seconds"), ("503", "engine unavailable"),
                ("504", "timed out")]},
        },
    }
