"""What Baton adds to vLLM's answers: the `baton` object, cached_tokens as
Baton counts them, OpenAI-style errors; driven through the ASGI wrapper."""

from __future__ import annotations

import asyncio
import json

from actors.finisher import Finisher, normalize_error, read_info
from common.response import BatonInfo
from deployments.metrics import IngressMetrics, merge


def run(app, path="/v1/chat/completions", headers=()):
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "method": "POST", "headers": list(headers)}
    asyncio.run(Finisher(app, "r-decode")(scope, receive, send))
    return sent


def json_app(status: int, body: dict):
    async def app(scope, receive, send):
        raw = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
        await send({"type": "http.response.body", "body": raw})
    return app


def test_json_answer_gets_baton_and_prefill_hit_as_cached_tokens():
    info = {"route": "prefix", "decode_only": False, "prefill_replica": "r-pre", "prefill_cached_tokens": 64}
    usage = {"prompt_tokens": 100, "completion_tokens": 2, "total_tokens": 102,
             "prompt_tokens_details": {"cached_tokens": 96}}
    sent = run(json_app(200, {"id": "x", "choices": [], "usage": usage}),
               headers=[(b"x-baton-info", json.dumps(info).encode())])
    body = json.loads(sent[1]["body"])
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 64
    assert body["baton"] == {"route": "prefix", "decode_only": False, "prefill_replica": "r-pre",
                             "decode_replica": "r-decode", "prefill_cached_tokens": 64,
                             "decode_cached_tokens": 96}
    assert dict(sent[0]["headers"])[b"content-length"] == str(len(sent[1]["body"])).encode()


def test_stream_chunks_pass_through_and_usage_chunk_gets_baton():
    chunks = [b'data: {"id":"x","choices":[{"delta":{"content":"a"}}]}\n\n',
              b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":1,'
              b'"total_tokens":41,"prompt_tokens_details":{"cached_tokens":32}}}\n\ndata: [DONE]\n\n']

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        for c in chunks:
            await send({"type": "http.response.body", "body": c, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    sent = run(app)
    assert sent[1]["body"] == chunks[0]
    events = sent[2]["body"].split(b"\n\n")
    usage_chunk = json.loads(events[0][6:])
    assert usage_chunk["baton"]["decode_cached_tokens"] == 32
    assert usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"] == 32  # decode-only: its hit
    assert events[1] == b"data: [DONE]"


def test_vllm_errors_become_openai_errors():
    sent = run(json_app(400, {"error": {"message": "This model's maximum context length is 2048 tokens.",
                                        "type": "BadRequestError", "param": None, "code": 400}}))
    err = json.loads(sent[1]["body"])["error"]
    assert sent[0]["status"] == 400
    assert err["type"] == "invalid_request_error" and err["code"] == "context_length_exceeded"
    assert normalize_error(404, {"error": {"message": "The model `x` does not exist."}})["error"]["code"] \
        == "model_not_found"
    assert normalize_error(500, "boom")["error"]["type"] == "server_error"


def test_other_paths_are_untouched_and_bad_info_is_ignored():
    sent = run(json_app(200, {"data": []}), path="/v1/models")
    assert json.loads(sent[1]["body"]) == {"data": []}
    assert read_info([(b"x-baton-info", b"not json")]) == BatonInfo()
    assert read_info([(b"x-baton-info", b'{"route": "load", "bogus": 1}')]).route == "load"


def test_metrics_of_replicas_are_summed():
    a, b = IngressMetrics(), IngressMetrics()
    a.permits.labels("t").inc()
    b.permits.labels("t").inc(2)
    a.record_hit(1, 4)
    b.record_hit(3, 4)
    text = merge([a.render(), b.render()]).decode()
    assert 'baton_permits_in_use{tenant="t"} 3.0' in text
    assert "baton_prefix_hit_ratio 0.5" in text
    assert 'baton_repins_total{pool="decode"} 0.0' in text


def test_each_answer_with_usage_reaches_on_usage_once():
    seen = []
    usage = {"prompt_tokens": 70, "completion_tokens": 1, "total_tokens": 71,
             "prompt_tokens_details": {"cached_tokens": 64}}
    app = Finisher(json_app(200, {"id": "x", "choices": [], "usage": usage}), "r",
                   on_usage=lambda info, n: seen.append((info.cached_tokens(), n)))

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        pass

    scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST", "headers": []}
    asyncio.run(app(scope, receive, send))
    m = IngressMetrics()
    info = BatonInfo(prefill_cached_tokens=32, decode_cached_tokens=64)
    m.record_usage(info, 70, 32, 1000)
    assert seen == [(64, 70)]
    assert 'baton_kv_bytes_moved_total 64000.0' in m.render().decode()
    assert "baton_prefix_hit_ratio 0.5" in m.render().decode()
