"""OpenAI request schemas and the error type every bad request becomes.

The front validates every body against these before vLLM sees it: a string
where a number belongs, an unknown field or role, a negative max_tokens or an
empty message list is a 400 with an OpenAI-style body, as in OpenAI's API
(vLLM alone accepts unknown fields and roles). They cover what agents send:
tools and tool_choice, tool-call and tool-result turns, response_format
(json_object, json_schema), logprobs/top_logprobs, n and the penalties. The
body itself then goes to vLLM unchanged but for Baton's fields.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


MAX_MESSAGES = 4096  # per chat request; more is a 400, never an out-of-memory


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


class ToolCallFunction(_Request):
    name: str
    arguments: str


class ToolCall(_Request):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Request):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDef(_Request):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Request):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Request):
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = Field(None, description="up to 4 stop sequences")
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=16, description="choices per request")
    user: str | None = None
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    return_token_ids: bool = Field(False, description="vLLM extension: add `token_ids` to choices")
    ignore_eos: bool = Field(False, description="vLLM extension: generate exactly max_tokens")

    @field_validator("stop")
    @classmethod
    def _at_most_four(cls, v):
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop sequences are allowed")
        return v


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)


class CompletionRequest(_Sampling):
    prompt: str | list[Annotated[int, Field(ge=0)]] | list[str] = Field(min_length=1)
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False


def _is_field(part) -> bool:
    """False for the union-member tags pydantic puts in an error's location."""
    if isinstance(part, int):
        return True
    return not ("[" in part or "(" in part or part[:1].isupper() or part in ("str", "int", "float", "bool"))


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
        loc = ".".join(str(p) for p in err["loc"] if _is_field(p))
        if err["type"] == "extra_forbidden":
            msg = f"Unrecognized request argument supplied: {loc}"
        elif err["type"] == "missing":
            msg = f"Missing required parameter: '{loc}'"
        else:
            msg = f"Invalid value for '{loc}': {err['msg']}"
        raise APIError(400, msg, param=loc or None) from None


def inline(node, defs: dict):
    if isinstance(node, dict):
        if "$ref" in node:
            return inline(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        return {k: inline(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [inline(v, defs) for v in node]
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
    body = inline(schema, schema.get("$defs", {}))
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


def openapi_document() -> dict:
    """The OpenAPI 3.1 document of the public endpoint (what the front accepts)."""
    error = {"content": {"application/json": {"schema": ERROR_SCHEMA}}}
    ok = {"description": "ok", "content": {"application/json": {"schema": {"type": "object"}}}}
    starting = {"description": "starting: retry after Retry-After seconds", **error}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Baton", "version": "1",
                 "description": "OpenAI-compatible, PD-disaggregated LLM serving"},
        "paths": {
            "/v1/chat/completions": {"post": openapi_operation(ChatCompletionRequest)},
            "/v1/completions": {"post": openapi_operation(CompletionRequest)},
            "/v1/models": {"get": {"responses": {"200": ok, "401": {"description": "bad API key", **error},
                                                 "503": starting}}},
            "/health": {"get": {"responses": {"200": ok, "503": {"description": "starting", "content": {
                "application/json": {"schema": {"type": "object"}}}}}}},
        },
    }
