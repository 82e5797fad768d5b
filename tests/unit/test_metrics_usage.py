"""Usage a bill can be built on: baton_usage_tokens_total{tenant, model, kind} and
baton_usage_requests_total{tenant, model}, counted once per answer from the usage
its client receives, summed across replicas by /metrics; and the headers the
front sends so that the Finisher computing an answer knows whose it is."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from actors.finisher import Finisher
from common.response import BatonInfo
from deployments.front import relay
from deployments.api.apis import APIS
from deployments.front.pipeline.dispatch import Dispatch
from deployments.front.pipeline.route import Unrouted
from deployments.front.pipeline.request import Request
from deployments.front.metrics import IngressMetrics, merge


def usage(prompt: int, cached: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def samples(text: bytes) -> dict:
    """{(sample name, sorted labels): value} of an exposition."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text.decode()) for s in fam.samples}


def tokens(tenant: str, model: str, kind: str) -> tuple:
    return "baton_usage_tokens_total", (("kind", kind), ("model", model), ("tenant", tenant))


def requests(tenant: str, model: str) -> tuple:
    return "baton_usage_requests_total", (("model", model), ("tenant", tenant))


def test_each_answer_adds_its_tokens_by_kind_and_one_request():
    m = IngressMetrics()
    m.record_usage(BatonInfo(), usage(100, 64, 7), "acme", "baton-tiny", 16, 1)
    m.record_usage(BatonInfo(), usage(20, 0, 3), "acme", "baton-tiny", 16, 1)
    m.record_usage(BatonInfo(), {"prompt_tokens": 5, "completion_tokens": 1}, "beta", "baton-tiny", 16, 1)
    got = samples(m.render())
    assert got[tokens("acme", "baton-tiny", "prompt")] == 120
    assert got[tokens("acme", "baton-tiny", "cached")] == 64
    assert got[tokens("acme", "baton-tiny", "completion")] == 10
    assert got[requests("acme", "baton-tiny")] == 2
    assert got[tokens("beta", "baton-tiny", "cached")] == 0  # no details: nothing cached
    assert got[requests("beta", "baton-tiny")] == 1


def test_two_replicas_counts_are_summed_by_tenant_model_and_kind():
    a, b = IngressMetrics(), IngressMetrics()
    a.record_usage(BatonInfo(), usage(100, 64, 7), "acme", "m", 16, 1)
    b.record_usage(BatonInfo(), usage(50, 16, 5), "acme", "m", 16, 1)
    b.record_usage(BatonInfo(), usage(9, 0, 1), "beta", "m", 16, 1)
    merged = merge([a.render(), b.render()])
    got = samples(merged)
    assert got[tokens("acme", "m", "prompt")] == 150
    assert got[tokens("acme", "m", "cached")] == 80
    assert got[tokens("acme", "m", "completion")] == 12
    assert got[requests("acme", "m")] == 2
    assert got[tokens("beta", "m", "prompt")] == 9 and got[requests("beta", "m")] == 1
    text = merged.decode()
    assert "# TYPE baton_usage_tokens counter" in text
    assert 'baton_usage_tokens_total{kind="prompt",model="m",tenant="acme"} 150.0' in text
    # A counter's creation time is the earliest replica's, not a sum of times.
    created = got[("baton_usage_requests_created", (("model", "m"), ("tenant", "acme")))]
    first = samples(a.render())[("baton_usage_requests_created", (("model", "m"), ("tenant", "acme")))]
    assert created == first


def test_merge_keeps_tenant_names_that_need_escaping():
    a, b = IngressMetrics(), IngressMetrics()
    odd = 'we "quote"\\and\nbreak'
    a.record_usage(BatonInfo(), usage(3, 0, 1), odd, "m", 16, 1)
    b.record_usage(BatonInfo(), usage(4, 0, 1), odd, "m", 16, 1)
    got = samples(merge([a.render(), b.render()]))
    assert got[tokens(odd, "m", "prompt")] == 7 and got[requests(odd, "m")] == 2


# -- from the front to the Finisher to the counters ---------------------------------------------

USAGE_CHUNK = (b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,'
               b'"total_tokens":14,"prompt_tokens_details":{"cached_tokens":0}}}\n\n')
DONE = b"data: [DONE]\n\n"
TEXT = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"length"}]}\n\n'


def _front(metrics: IngressMetrics, seen: list) -> Dispatch:
    """The front's dispatch stage; its local app is vLLM's stand-in behind a Finisher
    counting into `metrics`, and records each request's headers and body."""
    async def vllm(scope, receive, send):
        body = json.loads((await receive())["body"])
        seen.append((dict(scope["headers"]), body))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        for chunk in (TEXT, USAGE_CHUNK if (body.get("stream_options") or {}).get("include_usage") else b"", DONE):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    dispatch = Dispatch("r", None, 5, metrics, Unrouted(None, 1))
    dispatch.local = Finisher(vllm, "r", on_usage=lambda *a: metrics.record_usage(*a, 16, 1))
    return dispatch


def _dispatch(dispatch: Dispatch, body: dict, client_headers: list, route=None) -> bytes:
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.disconnect"}

    scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST", "headers": client_headers}
    req = Request(scope, receive, send, APIS["/v1/chat/completions"])
    req.body, req.tenant, req.route, req.app = body, "acme", route, dispatch.local
    req.identify()
    req.stream = relay.EarlyStream(send, req.response_headers)
    asyncio.run(dispatch(req, lambda timing: None))
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_a_stream_that_did_not_ask_is_billed_and_sees_no_usage_chunk():
    metrics, seen = IngressMetrics(), []
    front = _front(metrics, seen)
    forged = [(b"x-baton-tenant", b"someone-else"), (b"x-baton-model", b"free"), (b"x-baton-hide-usage", b"0")]
    out = _dispatch(front, {"model": "baton-tiny", "stream": True, "cache_salt": "acme"}, forged)
    assert out == TEXT + DONE
    headers, body = seen[0]
    assert body["stream_options"] == {"include_usage": True}
    assert headers[b"x-baton-tenant"] == b"acme" and headers[b"x-baton-model"] == b"baton-tiny"
    assert headers[b"x-baton-hide-usage"] == b"1"
    got = samples(metrics.render())
    assert got[tokens("acme", "baton-tiny", "prompt")] == 12 and got[requests("acme", "baton-tiny")] == 1
    assert ("baton_usage_requests_total", (("model", "free"), ("tenant", "someone-else"))) not in got


def test_a_stream_that_asked_gets_its_usage_chunk_counted_once():
    metrics, seen = IngressMetrics(), []
    out = _dispatch(_front(metrics, seen), {"model": "baton-tiny", "stream": True,
                                            "stream_options": {"include_usage": True}}, [])
    assert b'"choices":[]' in out and out.endswith(DONE)
    assert seen[0][0][b"x-baton-hide-usage"] == b"0"
    assert samples(metrics.render())[requests("acme", "baton-tiny")] == 1


def test_the_remote_path_sends_the_same_headers(monkeypatch):
    calls = []

    async def run_remote(session, url, body, headers, *rest, **kw):
        calls.append((json.loads(body), headers))

    monkeypatch.setattr(relay, "run_remote", run_remote)
    front = _front(IngressMetrics(), [])
    route = SimpleNamespace(decode_replica="other", decode_url="http://other")
    _dispatch(front, {"model": "baton-tiny", "stream": True}, [(b"x-baton-tenant", b"forged")], route)
    body, headers = calls[0]
    assert body["stream_options"] == {"include_usage": True}
    assert headers["x-baton-tenant"] == "acme" and headers["x-baton-model"] == "baton-tiny"
    assert headers["x-baton-hide-usage"] == "1"
