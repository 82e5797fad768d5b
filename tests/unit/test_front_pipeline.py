"""The front's request pipeline (deployments/front/pipeline/): every way a request ends frees its
permit exactly once, and early (when the engine has answered, not when the client has read).

The engine is a plain ASGI app standing in for vLLM's; the admission is Baton's own, unmocked.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import redis

from common.config import AdmissionConfig, BatonConfig
from common.constants import REPO_ROOT
from deployments.admission import Admission, AsyncAdmission
from deployments.api.api_keys import KeyTable, hash_key
from deployments.front.front import Front
from deployments.front.metrics import IngressMetrics

KEY = "key-t"
PATH = "/v1/chat/completions"


class _Engine:
    """What the unrouted placement asks of its engine: how many requests it runs, and whether it died."""

    def running(self) -> int:
        return 0

    def errored(self) -> bool:
        return False


def _front(app) -> Front:
    cfg = BatonConfig.model_validate({"serve": {"api_keys": {hash_key(KEY): "t"}}})
    gate = AsyncAdmission(Admission(AdmissionConfig(capacity_per_replica=1, max_queue_per_tenant=4)))
    return Front(cfg, "r", _Engine(), app, None, gate, IngressMetrics(), None, None, None,
                 KeyTable(cfg.serve.api_keys))


def _body(**over) -> bytes:
    return json.dumps({"model": BatonConfig().model.served_name, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hi"}], **over}).encode()


async def _answering(scope, receive, send):
    """The engine's answer: the body it got, echoed."""
    got = json.loads((await receive())["body"])
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps(got).encode(), "more_body": False})


async def _failing(scope, receive, send):
    raise RuntimeError("engine bug")


async def _call(front: Front, raw: bytes, send=None) -> tuple[int, bytes]:
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}

    async def record(message):
        sent.append(message)
        if send is not None:
            await send(message)

    scope = {"type": "http", "path": PATH, "method": "POST",
             "headers": [(b"authorization", f"Bearer {KEY}".encode()), (b"content-type", b"application/json")]}
    await front(scope, receive, record)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def _held(front: Front) -> tuple[int, float]:
    """Permits in use by admission, and the tenant's permit gauge (which a double release drives below 0)."""
    gauge = front.metrics.permits.labels("t")._value.get()
    return front.gate.snapshot().permits_in_use, gauge


def test_an_answered_request_frees_its_permit_once_and_the_engine_sees_the_built_body():
    front = _front(_answering)
    status, out = asyncio.run(_call(front, _body()))
    assert status == 200 and _held(front) == (0, 0)
    engine_body = json.loads(out)
    assert engine_body["cache_salt"] == "t" and engine_body["request_id"]


def test_every_refusal_after_admission_frees_its_permit_once():
    for raw, status in ((b"{not json", 400), (_body(model="nope"), 404), (_body(bogus=1), 400)):
        front = _front(_answering)
        assert asyncio.run(_call(front, raw))[0] == status, raw
        assert _held(front) == (0, 0), raw


def test_an_engine_that_fails_is_a_500_and_frees_its_permit_once():
    front = _front(_failing)
    status, out = asyncio.run(_call(front, _body()))
    assert status == 500 and b"internal error" in out
    assert _held(front) == (0, 0)


def test_redis_away_is_a_clean_503_with_retry_after_and_frees_its_permit_once():
    """A route whose state is in Redis (stored responses, batches) while Redis restarts."""
    async def redis_away(scope, receive, send):
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    front = _front(redis_away)
    status, out = asyncio.run(_call(front, _body()))
    err = json.loads(out)["error"]
    assert status == 503 and err["code"] == "store_unavailable" and "6379" not in err["message"]
    assert _held(front) == (0, 0)


def test_the_permit_is_free_while_a_slow_client_still_reads():
    front = _front(_answering)
    seen: list[tuple[int, float]] = []

    async def slow_client(message):
        if message["type"] == "http.response.body":
            seen.append(_held(front))  # the engine has answered; the client has not read it yet
            await asyncio.sleep(0.05)

    assert asyncio.run(_call(front, _body(), slow_client))[0] == 200
    assert seen and seen[0] == (0, 0)


def test_only_finish_releases_a_permit():
    """One release site: no module of the front but the finish stage releases a permit."""
    front_dir = REPO_ROOT / "deployments" / "front"
    releasing = sorted(str(p.relative_to(front_dir)) for p in front_dir.rglob("*.py")
                       if re.search(r"permit\.release\(", Path(p).read_text()))
    assert releasing == ["pipeline/finish.py"]


def test_a_responses_request_stays_at_its_site_where_chat_may_go_to_another():
    """The chain a Responses request continues and the response it stores live in this site's
    Redis, so it never leaves for another site; a chat request goes where the site policy says."""
    from deployments.api import apis
    from deployments.front.pipeline.auth import Auth, NoSites
    from deployments.front.pipeline.request import Request

    class EverythingElsewhere(NoSites):
        """A site policy that sends every request it is asked about to another site."""

        def __init__(self):
            self.asked: list[str] = []

        async def offload(self, scope, receive, send, tenant, parse):
            self.asked.append(scope["path"])
            return True, None

    sites = EverythingElsewhere()
    auth = Auth(BatonConfig().serve, KeyTable({}), sites)
    for path, leaves in (("/v1/chat/completions", True), ("/v1/responses", False), ("/v1/messages", True)):
        req = Request({"type": "http", "path": path, "headers": []}, None, None, apis.APIS[path])
        assert asyncio.run(auth.offloaded(req, lambda raw: None)) is leaves, path
    assert sites.asked == ["/v1/chat/completions", "/v1/messages"]
