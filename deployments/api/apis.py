"""The engine-reaching APIs of the public front, and what differs between them.

Chat completions, completions, OpenAI's Responses and Anthropic's Messages
all take one request path in the front (deployments/front/front.py): auth and
tenant, body limit, strict schema, admission, the tenant's `cache_salt`,
routing with affinity and the disaggregated prefill, usage. Only the body's
schema, its error shape and how its prompt is rendered differ; rendering and
answering stay vLLM's (its Responses and Anthropic layers convert to and
from its chat layer).

Default deny: of the routes vLLM's app mounts (`ENGINE_ROUTES`, which
tests/unit/test_apis.py checks against the app vLLM builds, so an upgrade
cannot open a path silently), the front serves the pipeline's, answers a
few itself, passes the ones that never reach the engine's scheduler to the
app, and refuses every other with a 404.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import ValidationError
from pydantic_core import from_json

from actors.openai_app import request_model
from deployments.api import schemas
from deployments.api.schemas import APIError

OPENAI, ANTHROPIC = "openai", "anthropic"


@dataclass(frozen=True)
class Api:
    """One engine-reaching API: `kind` names it to the renderer and the Finisher."""

    kind: str  # chat | text | responses | messages | count_tokens
    path: str
    shape: str  # OPENAI or ANTHROPIC: the shape of its error bodies
    generates: bool = True  # False: no engine step (count_tokens), so no permit and no usage


APIS = {a.path: a for a in (
    Api("chat", "/v1/chat/completions", OPENAI),
    Api("text", "/v1/completions", OPENAI),
    Api("responses", "/v1/responses", OPENAI),
    Api("messages", "/v1/messages", ANTHROPIC),
    Api("count_tokens", "/v1/messages/count_tokens", ANTHROPIC, generates=False),
)}

# Every route vLLM's app mounts, and what the front does with it:
# pipeline (APIS), front (answered by the front itself), local (passed to the app: no
# engine step, no tenant data) or refused (404).
ENGINE_ROUTES: dict[tuple[str, str], str] = {
    **{("POST", p): "pipeline" for p in APIS},
    ("GET", "/v1/responses/{response_id}"): "front",  # Baton's response store (deployments/api/response_store.py)
    ("POST", "/v1/responses/{response_id}/cancel"): "front",
    ("GET", "/health"): "front", ("GET", "/metrics"): "front", ("GET", "/openapi.json"): "front",
    ("GET", "/v1/models"): "local", ("POST", "/tokenize"): "local", ("POST", "/detokenize"): "local",
    ("GET", "/version"): "local",
    **{(m, p): "refused" for m, p in [
        ("GET", "/docs"), ("GET", "/docs/oauth2-redirect"), ("GET", "/redoc"), ("GET", "/load"),
        ("GET", "/kv_event_sources"), ("POST", "/v1/systemone"), ("GET", "/ping"), ("POST", "/ping"),
        ("POST", "/invocations"), ("POST", "/v1/chat/completions/batch"), ("POST", "/generative_scoring"),
        ("POST", "/scale_elastic_ep"), ("POST", "/is_scaling_elastic_ep"),
        ("POST", "/v1/chat/completions/render"), ("POST", "/v1/messages/render"),
        ("POST", "/v1/completions/render"), ("POST", "/v1/responses/render"),
        ("POST", "/v1/chat/completions/derender"), ("POST", "/v1/completions/derender"),
        ("POST", "/inference/v1/generate"), ("POST", "/inference/v1/abort_requests"),
        ("POST", "/v1/load_lora_adapter"), ("POST", "/v1/unload_lora_adapter")]},
}
LOCAL_ROUTES = frozenset(p for (_, p), what in ENGINE_ROUTES.items() if what == "local")

# Top-level fields each API accepts: its public schema's (as OpenAI and Anthropic document
# them) that vLLM implements. Anything else is a 400, as in OpenAI's and Anthropic's APIs;
# vLLM's own extensions (cache_salt, kv_transfer_params, request_id, priority, ...) are
# Baton's to set, never a client's.
RESPONSES_FIELDS = frozenset({
    "input", "instructions", "max_output_tokens", "max_tool_calls", "metadata", "model",
    "parallel_tool_calls", "previous_response_id", "reasoning", "store", "stream", "temperature", "text",
    "tool_choice", "tools", "top_logprobs", "top_p", "truncation", "user", "include", "background",
    "service_tier", "prompt_cache_key"})
MESSAGES_FIELDS = frozenset({
    "model", "messages", "max_tokens", "metadata", "stop_sequences", "stream", "system", "temperature",
    "tool_choice", "tools", "top_k", "top_p", "thinking", "output_config",
    # Anthropic's, and meaningless here: caching is automatic, there is one tier.
    "cache_control", "service_tier"})
COUNT_TOKENS_FIELDS = frozenset({"model", "messages", "system", "thinking", "tool_choice", "tools"})


def anthropic_error(status: int, message: str) -> dict:
    """An error body in Anthropic's shape."""
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
            503: "overloaded_error", 529: "overloaded_error"}.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_body(exc: APIError, shape: str) -> dict:
    """`exc` as the body its API answers errors with."""
    return anthropic_error(exc.status, exc.message) if shape == ANTHROPIC else exc.body()


def shape_of(path: str) -> str:
    """The error shape of the API at `path` (OpenAI's for any other path)."""
    api = APIS.get(path)
    return api.shape if api is not None else OPENAI


def _strict_vllm(kind: str, raw: bytes, allowed: frozenset) -> dict:
    """The body of a Responses or Messages request, checked: unknown top-level fields and
    what vLLM's own model of the request refuses are 400s. Returns it as a dict."""
    if not raw.strip():
        raise APIError(400, "request body is empty; expected a JSON object")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise APIError(400, f"invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    if unknown := sorted(set(body) - allowed):
        raise APIError(400, f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise APIError(400, "Missing required parameter: 'model'", param="model")
    if kind == "responses" and body.get("background"):
        raise APIError(400, "background responses are not supported", param="background")
    if kind == "responses" and body.get("input") in (None, "", []):
        raise APIError(400, "Missing required parameter: 'input'", param="input")
    try:
        request_model(kind).model_validate(json.loads(raw))  # a copy: vLLM's validators change what they check
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise APIError(400, f"Invalid value for '{loc}': {err['msg']}", param=loc or None) from None
    return body


def parse(api: Api, raw: bytes) -> dict:
    """The validated body of a request to `api`, as a dict; APIError(400) naming the first
    bad field. Changes nothing."""
    if api.kind in ("chat", "text"):
        schemas.parse(schemas.ChatCompletionRequest if api.kind == "chat" else schemas.CompletionRequest, raw)
        return from_json(raw)  # the parser the validation above ran: the same JSON accepted
    allowed = {"responses": RESPONSES_FIELDS, "messages": MESSAGES_FIELDS}.get(api.kind, COUNT_TOKENS_FIELDS)
    return _strict_vllm(api.kind, raw, allowed)


def session_of(api: Api, header_value: str | None, body: dict) -> str | None:
    """A request's session key: the `x-session-affinity` header, or for Messages the body's
    `metadata.user_id` (what Anthropic's clients send for a conversation)."""
    if header_value:
        return header_value
    if api.kind == "messages":
        user = (body.get("metadata") or {}).get("user_id")
        return str(user) if user else None
    return None


ANTHROPIC_ERROR_SCHEMA = {
    "type": "object", "required": ["type", "error"],
    "properties": {"type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"],
                                                         "properties": {"type": {"type": "string"},
                                                                        "message": {"type": "string"}}}}}


def _operation(kind: str, allowed: frozenset, answer: list[str], shape: str) -> dict:
    """The OpenAPI operation of a Responses or Messages route: vLLM's request schema cut to the
    fields the front accepts (what a client may send), and the answers in the API's shape."""
    schema = request_model(kind).model_json_schema()
    body = schemas.inline(schema, schema.get("$defs", {}))
    body["properties"] = {k: v for k, v in body.get("properties", {}).items() if k in allowed}
    body["required"] = [k for k in body.get("required", []) if k in allowed]
    body["additionalProperties"] = False
    op = schemas.openapi_operation(schemas.ChatCompletionRequest)  # the statuses every route answers
    op["requestBody"]["content"]["application/json"]["schema"] = body
    op["responses"]["200"]["content"]["application/json"]["schema"] = {"type": "object", "required": answer}
    if shape == ANTHROPIC:
        for code, resp in op["responses"].items():
            if code != "200":
                resp["content"]["application/json"]["schema"] = ANTHROPIC_ERROR_SCHEMA
    return {"post": op}


def openapi_document() -> dict:
    """The OpenAPI 3.1 document of the public endpoint: chat and completions (Baton's schemas),
    Responses and Messages (vLLM's, cut to what the front accepts)."""
    doc = schemas.openapi_document()
    responses = _operation("responses", RESPONSES_FIELDS, ["id", "output"], OPENAI)
    props = responses["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    # OpenAI's item and tool unions are 250 kB of schema; the document names their outline.
    props["input"] = {"anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["role", "content"],
        "properties": {"role": {"enum": ["user", "assistant", "system", "developer"]},
                       "content": {"type": "string"}}}}]}
    props["tools"] = {"type": "array", "items": {"type": "object"}}
    doc["paths"]["/v1/responses"] = responses
    doc["paths"]["/v1/messages"] = _operation("messages", MESSAGES_FIELDS, ["id", "content"], ANTHROPIC)
    count = _operation("count_tokens", COUNT_TOKENS_FIELDS, ["input_tokens"], ANTHROPIC)
    del count["post"]["responses"]["429"]  # no engine step: never shed
    doc["paths"]["/v1/messages/count_tokens"] = count
    return doc
