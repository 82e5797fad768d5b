"""A request that this replica's engine dies with before its answer began runs again elsewhere.

The engine's death is what vLLM's app answers while its engine is dead: a 503
`engine_unavailable` for a plain request, a 200 stream whose first event is an
error for one that waited in the engine's queue. Neither reaches the client:
the front places the request again (route.py picks a peer once its engine is
dead) and relays the peer's answer. A live engine's errors pass as they are.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from common.constants import ENGINE_GONE
from deployments.api.apis import APIS
from deployments.front import relay
from deployments.front.internal import internal_app
from deployments.front.metrics import IngressMetrics
from deployments.front.pipeline.dispatch import Dispatch
from deployments.front.pipeline.request import Request
from deployments.front.pipeline.route import Unrouted

pytestmark = pytest.mark.timeout(20)

STREAM_ERROR = b'data: {"error": {"message": "EngineCore encountered an issue.", "code": 500}}\n\n'
TOKEN = b'data: {"choices": [{"delta": {"content": "hi"}, "finish_reason": null}]}\n\n'


class _Engine:
    def __init__(self, dead: bool) -> None:
        self.dead = dead

    def running(self) -> int:
        return 0

    def errored(self) -> bool:
        return self.dead


def _app(status: int, *chunks: bytes):
    """An engine's app that answers `status` and `chunks`, as vLLM's does."""
    async def app(scope, receive, send):
        await receive()
        kind = b"text/event-stream" if status == 200 else b"application/json"
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", kind)]})
        for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    return app


def _run(app, engine: _Engine, peers: dict[str, str], remote_answers: list | None = None):
    """Dispatches one chat request to `app` here, `peers` (front -> url) known to the unrouted
    placement. Returns (what the client got, the URLs the request was sent to, the request)."""
    sent, forwarded, done = [], [], []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.disconnect"}

    async def run_remote(_http, url, body, _headers, send_to, extra, on_done, *_rest, **_kw):
        forwarded.append((url, json.loads(body)))
        if remote_answers:
            raise remote_answers.pop(0)
        await send_to({"type": "http.response.start", "status": 200, "headers": extra})
        await send_to({"type": "http.response.body", "body": TOKEN, "more_body": False})
        on_done(relay.Timing())

    placement = Unrouted(engine, capacity=4)
    placement.spill_view({f: type("Peer", (), {"url": u, "running": 0})() for f, u in peers.items()})
    dispatch = Dispatch("r", None, 5, IngressMetrics(), placement, engine.errored)
    scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST", "headers": []}
    req = Request(scope, receive, send, APIS["/v1/chat/completions"])
    req.body, req.tenant, req.app = {"model": "m", "messages": [], "stream": True}, "acme", app
    req.identify()
    req.stream = relay.EarlyStream(send, req.response_headers)
    saved, relay.run_remote = relay.run_remote, run_remote
    try:
        asyncio.run(dispatch(req, done.append))
    finally:
        relay.run_remote = saved
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"), forwarded, req


@pytest.mark.parametrize("answer", [(503, json.dumps(ENGINE_GONE).encode()), (200, STREAM_ERROR, b"data: [DONE]\n\n")],
                         ids=["plain", "stream"])
def test_a_request_the_dead_engine_held_runs_on_a_peer(answer):
    status, body, forwarded, req = _run(_app(*answer), _Engine(dead=True), {"peer": "http://peer:1"})
    assert status == 200 and body == TOKEN
    assert [url for url, _ in forwarded] == ["http://peer:1/v1/chat/completions"]
    assert forwarded[0][1]["cache_salt"] == "acme"  # the same engine body: the tenant's salt kept
    assert req.route.decode_replica == "peer" and req.info.retried_after == "EngineDeadError"


def test_a_live_engines_error_is_the_clients():
    status, body, forwarded, _ = _run(_app(200, STREAM_ERROR, b"data: [DONE]\n\n"), _Engine(dead=False),
                                      {"peer": "http://peer:1"})
    assert status == 200 and body.startswith(STREAM_ERROR) and forwarded == []


def test_without_a_peer_the_dead_engines_answer_is_the_clients():
    status, body, forwarded, _ = _run(_app(503, json.dumps(ENGINE_GONE).encode()), _Engine(dead=True), {})
    assert status == 503 and json.loads(body)["error"]["code"] == "engine_unavailable" and forwarded == []


def test_a_request_is_placed_again_once():
    """The peer it was placed on fails too: the dead engine's own answer ends it, nothing loops."""
    status, _body, forwarded, _ = _run(_app(503, json.dumps(ENGINE_GONE).encode()), _Engine(dead=True),
                                       {"peer": "http://peer:1"}, [relay.UpstreamUnavailable("refused: 503")])
    assert status == 503 and len(forwarded) == 1


def test_an_answer_begun_before_the_death_is_not_run_again():
    status, body, forwarded, _ = _run(_app(200, TOKEN, STREAM_ERROR), _Engine(dead=True), {"peer": "http://peer:1"})
    assert status == 200 and body == TOKEN + STREAM_ERROR and forwarded == []


def test_the_internal_server_answers_a_forwarded_request_of_a_dead_engine_with_a_503():
    """Another front sent it; that front runs it again on a 503 `engine_unavailable` (`engine_gone`)."""
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    app = internal_app(_Engine(dead=True), _app(200, STREAM_ERROR, b"data: [DONE]\n\n"))
    asyncio.run(app({"type": "http", "path": "/v1/chat/completions", "method": "POST", "headers": []}, receive, send))
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [503]
    first = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert relay.engine_gone(503, first) and not relay.engine_gone(429, first)
