"""What Baton adds to vLLM's answers: the `baton` object, cached_tokens as
Baton counts them, OpenAI-style errors; driven through the ASGI wrapper."""

from __future__ import annotations

import asyncio
import json

from actors.finisher import Finisher, ask_usage, normalize_error, read_info, usage_headers
from common.response import BatonInfo
from deployments.front.metrics import IngressMetrics, merge


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
    app = sse_app(chunks)

    sent = run(app)
    assert sent[1]["body"] == chunks[0]
    events = sent[2]["body"].split(b"\n\n")
    usage_chunk = json.loads(events[0][6:])
    assert usage_chunk["baton"]["decode_cached_tokens"] == 32
    assert usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"] == 32  # decode-only: its hit
    assert events[1] == b"data: [DONE]"


def test_a_stream_its_engine_died_in_ends_with_baton_s_engine_unavailable_event():
    """vLLM's own event, as its chat stream generator writes it for EngineDeadError."""
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
    from vllm.v1.engine.exceptions import EngineDeadError

    vllm_event = f"data: {json.dumps(create_error_response(EngineDeadError()).model_dump())}\n\n".encode()
    token = b'data: {"id":"x","choices":[{"delta":{"content":"a"}}]}\n\n'
    sent = run(sse_app([token, vllm_event, b"data: [DONE]\n\n"]))
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body"]
    assert bodies[0] == token and bodies[2] == b"data: [DONE]\n\n"
    err = json.loads(bodies[1].removeprefix(b"data: "))["error"]
    assert err["code"] == "engine_unavailable" and err["type"] == "server_error" and "stack trace" not in err["message"]


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
    assert read_info({b"x-baton-info": b"not json"}) == BatonInfo()
    assert read_info({b"x-baton-info": b"[1]"}) == BatonInfo()
    assert read_info({b"x-baton-info": b'{"route": "load", "bogus": 1}'}).route == "load"


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
                   on_usage=lambda info, u, tenant, model: seen.append((info.cached_tokens(), u["prompt_tokens"])))

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        pass

    scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST", "headers": []}
    asyncio.run(app(scope, receive, send))
    m = IngressMetrics()
    info = BatonInfo(prefill_cached_tokens=32, decode_cached_tokens=64)
    m.record_usage(info, {"prompt_tokens": 70, "completion_tokens": 1}, "t", "m", 32, 1000)
    assert seen == [(64, 70)]
    assert 'baton_kv_bytes_moved_total 64000.0' in m.render().decode()
    assert "baton_prefix_hit_ratio 0.5" in m.render().decode()


# -- usage for the bill: what on_usage sees is what the client receives, once ----------------

FINGERPRINT = "fp_baton"
ROLE = b'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null}]}\n\n'
TOKEN = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]}\n\n'
LAST = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"b"},"logprobs":null,"finish_reason":"length"}]}\n\n'
USAGE_CHUNK = (b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":2,"total_tokens":42,'
               b'"prompt_tokens_details":{"cached_tokens":32}},"system_fingerprint":"fp_baton"}\n\n')
DONE = b"data: [DONE]\n\n"


def usage_run(app, headers=()):
    """(messages sent, on_usage calls) of one Finisher run."""
    sent, seen = [], []

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)

    finisher = Finisher(app, "r", on_usage=lambda info, usage, tenant, model: seen.append((usage, tenant, model)))
    scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST", "headers": list(headers)}
    asyncio.run(finisher(scope, receive, send))
    return sent, seen


def sse_app(chunks: list[bytes]):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        for c in chunks:
            await send({"type": "http.response.body", "body": c, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    return app


def streamed(sent: list[dict]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_json_answer_counts_the_usage_the_client_receives():
    usage = {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42,
             "prompt_tokens_details": {"cached_tokens": 32}}
    info = {"prefill_cached_tokens": 16}
    sent, seen = usage_run(json_app(200, {"id": "x", "choices": [], "usage": usage}),
                           [(b"x-baton-info", json.dumps(info).encode()),
                            *usage_headers("acme corp/ü", "baton-tiny", False)])
    body = json.loads(sent[1]["body"])
    assert seen == [(body["usage"], "acme corp/ü", "baton-tiny")]
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 16  # the prefill's hit, as Baton counts


def test_error_answers_and_answers_without_usage_are_not_counted():
    assert usage_run(json_app(400, {"error": {"message": "bad", "code": 400}}))[1] == []
    assert usage_run(sse_app([ROLE, TOKEN, LAST, DONE]))[1] == []


def test_stream_that_asked_for_usage_gets_it_and_counts_it_once():
    sent, seen = usage_run(sse_app([ROLE, TOKEN, LAST, USAGE_CHUNK + DONE]),
                           usage_headers("t", "m", False))
    events = streamed(sent).split(b"\n\n")
    assert events[:3] == [e.rstrip(b"\n") for e in (ROLE, TOKEN, LAST)]
    usage_chunk = json.loads(events[3][6:])
    assert events[4:] == [b"data: [DONE]", b""]
    assert len(seen) == 1 and seen[0] == (usage_chunk["usage"], "t", "m")
    assert usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"] == 32


def test_hidden_usage_chunk_is_counted_but_not_sent():
    sent, seen = usage_run(sse_app([ROLE, TOKEN, LAST, USAGE_CHUNK, DONE]), usage_headers("t", "m", True))
    out = streamed(sent)
    assert b'"usage"' not in out and b'"choices":[]' not in out
    last = LAST[:-3] + b',"system_fingerprint":"fp_baton"}\n\n'  # as vLLM sends it without a usage chunk
    assert out == ROLE + TOKEN + last + DONE
    assert seen == [({"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42,
                      "prompt_tokens_details": {"cached_tokens": 32}}, "t", "m")]


def test_hidden_usage_in_the_chunk_that_ends_the_stream_with_the_prefill_token():
    # The front streamed the prefill's first token: decode drops its role event and
    # counts that token as output, also when the usage chunk is hidden.
    info = [(b"x-baton-info", json.dumps({"first_token": "prefill", "prefill_cached_tokens": 0}).encode())]
    sent, seen = usage_run(sse_app([ROLE, TOKEN, LAST + USAGE_CHUNK + DONE]), info + usage_headers("t", "m", True))
    out = streamed(sent)
    assert out == TOKEN + LAST[:-3] + b',"system_fingerprint":"fp_baton"}\n\n' + DONE
    (usage, _, _), = seen
    assert usage["prompt_tokens"] == 39 and usage["completion_tokens"] == 3


def test_held_events_are_sent_when_no_usage_chunk_comes():
    sent, seen = usage_run(sse_app([ROLE, LAST, DONE]), usage_headers("t", "m", True))
    assert streamed(sent) == ROLE + LAST + DONE and seen == []


def test_ask_usage_makes_every_stream_report_it():
    plain = {"stream": True}
    assert ask_usage(plain) is True and plain["stream_options"] == {"include_usage": True}
    off = {"stream": True, "stream_options": {"include_usage": False, "continuous_usage_stats": True}}
    assert ask_usage(off) is True and off["stream_options"] == {"include_usage": True}
    asked = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    assert ask_usage(asked) is False and asked["stream_options"]["continuous_usage_stats"] is True
    whole = {"stream": False}
    assert ask_usage(whole) is False and "stream_options" not in whole


def test_continuous_usage_the_client_asked_for_is_counted_once_from_the_last_chunk():
    def chunk(choices: bytes, completion: int) -> bytes:
        return (b'data: {"id":"x","choices":' + choices + b',"usage":{"prompt_tokens":40,"completion_tokens":'
                + str(completion).encode() + b',"total_tokens":' + str(40 + completion).encode() + b'}}\n\n')
    sent, seen = usage_run(sse_app([chunk(b'[{"index":0,"delta":{"content":"a"}}]', 1),
                                    chunk(b'[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}]', 2),
                                    chunk(b"[]", 2), DONE]), usage_headers("t", "m", False))
    assert streamed(sent).count(b'"usage"') == 3
    assert len(seen) == 1 and seen[0][0]["completion_tokens"] == 2


def test_hidden_usage_keeps_the_order_of_choices_that_end_apart():
    first = b'data: {"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    other = b'data: {"id":"x","choices":[{"index":1,"delta":{"content":"c"},"finish_reason":null}]}\n\n'
    second = b'data: {"id":"x","choices":[{"index":1,"delta":{},"finish_reason":"stop"}]}\n\n'
    sent, seen = usage_run(sse_app([first, other, second, USAGE_CHUNK, DONE]), usage_headers("t", "m", True))
    fp = b',"system_fingerprint":"fp_baton"}\n\n'
    assert streamed(sent) == first[:-3] + fp + other + second[:-3] + fp + DONE
    assert len(seen) == 1
