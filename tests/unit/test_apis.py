"""The front's APIs without an engine: which of vLLM's routes it serves, each API's strict
schema and error shape, session keys, and the Finisher's usage in each API's shape."""

from __future__ import annotations

import argparse
import json

import pytest

from actors.finisher import finish_usage
from common.response import BatonInfo
from deployments.api import apis
from deployments.api.response_store import chained, input_items
from deployments.api.schemas import APIError


def _vllm_routes() -> set[tuple[str, str]]:
    """Every (method, path) of the app vLLM builds for Baton's default model."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.app import build_app

    from actors import engine_args
    from actors.openai_app import frontend_args
    from common.config import BatonConfig

    cfg = BatonConfig()
    eargs = AsyncEngineArgs(**{k: v for k, v in engine_args.engine_kwargs(cfg, "colocated").items()
                               if k != "structured_outputs_config"})
    args = argparse.Namespace(**(vars(frontend_args(cfg)) | vars(eargs)))
    args.served_model_name = [cfg.model.served_name]
    app = build_app(args, ("generate",), eargs.create_model_config())
    return {(m, r.path) for r in app.routes for m in (getattr(r, "methods", None) or ()) if m != "HEAD"}


def test_every_route_vllm_mounts_is_classified():
    """A vLLM upgrade that mounts a new route fails here until the route is classified in
    deployments/api/apis.py ENGINE_ROUTES (pipeline, front, local or refused)."""
    unclassified = sorted(_vllm_routes() - set(apis.ENGINE_ROUTES))
    assert unclassified == [], f"classify these in deployments/api/apis.py ENGINE_ROUTES: {unclassified}"


def test_the_pipeline_serves_the_generating_apis_and_passes_on_nothing_that_generates():
    """The front's generating APIs are exactly the paths whose answers the Finisher bills, with the
    same kinds (actors/finisher.py FINISHED_PATHS keeps its own table: actors sits below deployments)."""
    from actors.finisher import FINISHED_PATHS

    assert {p: a.kind for p, a in apis.APIS.items() if a.generates} == FINISHED_PATHS
    assert apis.LOCAL_ROUTES == {"/v1/models", "/tokenize", "/detokenize", "/version"}


@pytest.mark.parametrize("path,body,field", [
    ("/v1/responses", {"model": "m", "input": "hi", "cache_salt": "x"}, "cache_salt"),
    ("/v1/responses", {"model": "m", "input": "hi", "kv_transfer_params": {}}, "kv_transfer_params"),
    ("/v1/messages", {"model": "m", "max_tokens": 4, "messages": [], "request_id": "x"}, "request_id"),
    ("/v1/messages", {"model": "m", "max_tokens": 4, "messages": [], "cache_salt": "x"}, "cache_salt"),
    ("/v1/messages/count_tokens", {"model": "m", "messages": [], "max_tokens": 3}, "max_tokens"),
])
def test_unknown_and_baton_owned_fields_are_400s(path, body, field):
    with pytest.raises(APIError) as err:
        apis.parse(apis.APIS[path], json.dumps(body).encode())
    assert err.value.status == 400 and err.value.param == field


def test_a_bad_value_names_its_field_and_background_is_refused():
    with pytest.raises(APIError) as err:
        apis.parse(apis.APIS["/v1/messages"], b'{"model": "m", "max_tokens": "four", "messages": []}')
    assert err.value.status == 400 and err.value.param == "max_tokens"
    with pytest.raises(APIError) as err:
        apis.parse(apis.APIS["/v1/responses"], b'{"model": "m", "input": "x", "background": true}')
    assert err.value.param == "background"
    ok = apis.parse(apis.APIS["/v1/responses"], b'{"model": "m", "input": "x", "store": false}')
    assert ok == {"model": "m", "input": "x", "store": False}


def test_errors_take_the_shape_of_their_api():
    exc = APIError(429, "busy", "rate_limit_error", code="tenant_queue_full")
    assert apis.error_body(exc, apis.shape_of("/v1/messages")) == {
        "type": "error", "error": {"type": "rate_limit_error", "message": "busy"}}
    assert apis.error_body(exc, apis.shape_of("/v1/responses"))["error"]["code"] == "tenant_queue_full"


def test_a_messages_session_is_the_header_else_metadata_user_id():
    messages, chat = apis.APIS["/v1/messages"], apis.APIS["/v1/chat/completions"]
    assert apis.session_of(messages, "h", {"metadata": {"user_id": "u"}}) == "h"
    assert apis.session_of(messages, "", {"metadata": {"user_id": "u"}}) == "u"
    assert apis.session_of(chat, "", {"metadata": {"user_id": "u"}}) is None


def test_a_chain_sends_the_stored_conversation_then_the_new_input():
    previous = {"input": input_items("first?"), "session": "s",
                "response": {"output": [{"type": "message", "role": "assistant",
                                         "content": [{"type": "output_text", "text": "yes"}]}]}}
    body = {"model": "m", "input": "second?", "previous_response_id": "resp_1", "instructions": "be brief"}
    chained(body, previous)
    assert body == {"model": "m", "instructions": "be brief", "input": [
        {"type": "message", "role": "user", "content": "first?"},
        previous["response"]["output"][0],
        {"type": "message", "role": "user", "content": "second?"}]}


def test_messages_usage_reports_baton_s_cached_count_in_anthropic_s_terms():
    """Disaggregated: decode loaded 64 tokens prefill wrote (a transfer), prefill found 32 cached."""
    info = BatonInfo(prefill_cached_tokens=32)
    obj = {"type": "message", "usage": {"input_tokens": 36, "cache_read_input_tokens": 64, "output_tokens": 5}}
    counted = finish_usage(obj, info, "messages")
    assert obj["usage"] == {"input_tokens": 68, "cache_read_input_tokens": 32, "output_tokens": 5}
    assert counted == {"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 32}}
    assert obj["baton"]["decode_cached_tokens"] == 64
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 100, "output_tokens": 0}}}
    assert finish_usage(start, BatonInfo(), "messages")["prompt_tokens"] == 100


def test_responses_usage_in_a_stream_event_is_finished_in_place():
    event = {"type": "response.completed", "response": {"id": "resp_1", "usage": {
        "input_tokens": 50, "input_tokens_details": {"cached_tokens": 48}, "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 53}}}
    counted = finish_usage(event, BatonInfo(prefill_cached_tokens=0), "responses")
    assert event["response"]["usage"]["input_tokens_details"] == {"cached_tokens": 0}
    assert counted == {"prompt_tokens": 50, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}}
    assert "baton" in event["response"] and "baton" not in event
