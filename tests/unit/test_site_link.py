"""A front's site link (deployments/sites/site_link.py) against two peer sites on loopback: a refused
forward is chosen again (the other peer serves it, the refuser is backed off), never offered
twice to one site, and a peer that names the tenant as queue-full is not offered its request.

The peers are small aiohttp servers that answer the site probe and the completion path as a
Baton site would (one always refuses with a 429); the link, its admission and its policy are
the real ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from aiohttp import ClientSession, web

from common.config import load_config
from deployments.admission.admission import Admission
from deployments.admission.async_admission import AsyncAdmission
from deployments.sites.site_link import SiteLink
from routing.sites.latency_map import LatencyMap
from tests.unit.test_config import write

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


def _peer(name: str, refuse: bool, full_for: list[str], posts: list[str]) -> web.Application:
    async def probe(_request):
        return web.json_response({"site": name, "permits_free": 0 if full_for else 4, "permits_total": 4,
                                  "queue_wait_s": 0.1, "busy_avg": 0.1, "rtt_s": {},
                                  "queue_full_tenants": full_for})

    async def chat(request):
        posts.append(name + ("+turn" if request.headers.get("x-baton-site-turn") == "1" else ""))
        if refuse:
            return web.json_response({"error": {"message": "busy"}}, status=429)
        return web.json_response({"served_by": name})

    app = web.Application()
    app.router.add_get("/baton/site", probe)
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def _scenario(tmp_path, peers: dict[str, dict], requests: int, policy: str = "random_near",
                    tenant: str = "t", session_at: str | None = None):
    """Starts the peers, probes them once, holds the link's only permit (the site is full, with
    no queue) and offloads `requests` requests (turns of session "s" last served at `session_at`,
    if given); returns (what each offload returned, the posts each peer got, "+turn" where the
    forward said it is a turn, the answers' bodies, the link)."""
    posts: list[str] = []
    runners, urls = [], {}
    for name, spec in peers.items():
        runner = web.AppRunner(_peer(name, spec.get("refuse", False), spec.get("full_for", []), posts))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        urls[name] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    (tmp_path / "token").write_text("s3cret")
    peer_yaml = ", ".join(f"{{name: {n}, url: '{u}'}}" for n, u in urls.items())
    cfg = load_config(write(tmp_path, f"sites:\n  name: a\n  token_file: {tmp_path / 'token'}\n"
                                      f"  policy: {policy}\n  peers: [{peer_yaml}]\n"
                                      "admission: {capacity_per_replica: 1, max_queue_per_tenant: 0,"
                                      " max_queue_total: 0}\n"), environ={})
    gate = AsyncAdmission(Admission(cfg.admission, replicas=1))
    permit = await gate.acquire("other")  # the site's one permit is taken: it is full
    outs, bodies = [], []
    try:
        async with ClientSession() as http:
            link = SiteLink(cfg, gate, http)
            for name, url in urls.items():
                await link._probe(name, url)
            # The probes' measured RTTs order the near set, and with it the seeded draw: fixed ones,
            # in the peers' order, keep each scenario's draws the same run to run.
            link.latency = LatencyMap(ttl_s=link.latency.ttl_s)
            for i, name in enumerate(urls):
                link.latency.observe(link.name, name, 0.001 * (i + 1), link.clock())
            for _ in range(requests):
                if session_at is not None:
                    link.served_at("s", session_at)
                sent: list[dict] = []

                async def receive():
                    return {"type": "http.request", "body": BODY, "more_body": False}

                async def send(message, sent=sent):
                    sent.append(message)

                headers = [(b"x-session-affinity", b"s")] if session_at is not None else []
                scope = {"type": "http", "path": "/v1/chat/completions", "headers": headers}
                outs.append(await link.offload(scope, receive, send, tenant, lambda raw: json.loads(raw)))
                bodies.append(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))
    finally:
        permit.release()
        for runner in runners:
            await runner.cleanup()
    return outs, posts, bodies, link


@contextlib.asynccontextmanager
async def _t_queue_full(tmp_path):
    """A site of one permit (held by tenant x) and a queue of one place a tenant, t's taken: yields
    (the link, its admission); releases both requests after."""
    (tmp_path / "token").write_text("s3cret")
    cfg = load_config(write(tmp_path, f"sites:\n  name: a\n  token_file: {tmp_path / 'token'}\n"
                                      "  peers: [{name: b, url: 'http://127.0.0.1:9'}]\n"
                                      "admission: {capacity_per_replica: 1, max_queue_per_tenant: 1,"
                                      " max_queue_total: 4}\n"), environ={})
    gate = AsyncAdmission(Admission(cfg.admission, replicas=1))
    held = await gate.acquire("x")
    waiting = asyncio.ensure_future(gate.acquire("t"))  # t's one place in the queue
    await asyncio.sleep(0.01)
    try:
        async with ClientSession() as http:
            yield SiteLink(cfg, gate, http), gate
    finally:
        held.release()
        (await waiting).release()


def test_a_refused_forward_is_chosen_again_and_served_by_the_other_site(tmp_path):
    outs, posts, bodies, link = asyncio.run(_scenario(tmp_path, {"b": {"refuse": True}, "c": {}}, 6))
    assert outs == [(True, None)] * 6  # every request answered by a peer, none left to this full site
    assert all(json.loads(b) == {"served_by": "c"} for b in bodies)
    assert posts.count("c") == 6
    assert posts.count("b") == 1  # drawn once (the seeded draw), refused, then backed off
    assert link.selector.backoff.active("b", link.clock())


def test_no_site_is_offered_a_request_twice(tmp_path):
    # nearest_only has no backoff: after b's refusal it would pick b again; the link stops there
    # and the request is this site's to queue or refuse.
    outs, posts, _, _ = asyncio.run(_scenario(tmp_path, {"b": {"refuse": True}}, 2, policy="nearest_only"))
    assert [done for done, _ in outs] == [False, False]
    assert posts == ["b", "b"]  # one offer a request
    assert all(raw == BODY for _, raw in outs)  # the body read for the offer comes back for the local run


def test_a_peer_queue_full_for_the_tenant_is_not_offered_its_requests(tmp_path):
    peers = {"b": {"full_for": ["t"]}}
    outs, posts, _, _ = asyncio.run(_scenario(tmp_path, peers, 2, tenant="t"))
    assert posts == [] and [done for done, _ in outs] == [False, False]
    outs, posts, _, _ = asyncio.run(_scenario(tmp_path, peers, 2, tenant="u"))
    assert posts == ["b", "b"] and [done for done, _ in outs] == [True, True]


def test_a_turn_is_forwarded_to_its_site_as_a_turn_and_new_work_is_not(tmp_path):
    peers = {"b": {}, "c": {}}
    _, posts, _, _ = asyncio.run(_scenario(tmp_path, peers, 3, session_at="c"))
    assert posts == ["c+turn"] * 3
    _, posts, _, _ = asyncio.run(_scenario(tmp_path, peers, 3))
    assert posts and all(not p.endswith("+turn") for p in posts)


def test_a_turn_gets_the_turns_places_at_its_site_and_nowhere_else(tmp_path):
    async def scenario():
        async with _t_queue_full(tmp_path) as (link, gate):
            assert link.local_view("t").queue_wait_s == float("inf")
            assert link.local_view("t", turn=True).queue_wait_s < float("inf")  # one more place
            # the policy keeps a turn of a session served here, and marks it for admission
            link.served_at("s", "a")
            scope = {"type": "http", "path": "/v1/chat/completions", "headers": [(b"x-session-affinity", b"s")]}

            async def receive():
                return {"type": "http.request", "body": BODY, "more_body": False}

            assert await link.offload(scope, receive, None, "t", json.loads) == (False, None)
            assert link.turn_places(scope, forwarded=False) == 1
            assert link.turn_places({"headers": []}, forwarded=False) == 0
            # a forward's header is believed (the front checked its site token); a client's is not
            told = {"headers": [(b"x-baton-site-turn", b"1")]}
            assert link.turn_places(told, forwarded=True) == 1 and link.turn_places(told, forwarded=False) == 0
            turn = asyncio.ensure_future(gate.acquire("t", extra_queue=link.turn_places(scope, False)))
            await asyncio.sleep(0.01)
            assert not turn.done()  # queued beyond t's bound, not shed
        (await turn).release()

    asyncio.run(scenario())


def test_the_policy_switches_at_run_time_and_a_bad_name_is_a_400(tmp_path):
    from deployments.api.schemas import APIError

    async def scenario():
        _, _, _, link = await _scenario(tmp_path, {"b": {}}, 0)

        def body(raw: bytes):
            async def receive():
                return {"type": "http.request", "body": raw, "more_body": False}
            return receive

        link.sessions["s1"] = ("b", 1e18)
        answer = await link.switch_policy(body(b'{"policy": "local_only"}'))
        assert answer == {"site": "a", "policy": "local_only"}
        assert type(link.selector).__name__ == "LocalOnly" and not link.sessions
        for raw in (b'{"policy": "nearest"}', b"{}", b"not json"):
            try:
                await link.switch_policy(body(raw))
            except APIError as exc:
                assert exc.status == 400 and "random_near" in str(exc.body())
            else:
                raise AssertionError(f"{raw!r} was accepted")
        assert type(link.selector).__name__ == "LocalOnly"

    asyncio.run(scenario())


def test_the_local_view_and_the_probe_answer_name_the_tenants_whose_queue_is_full(tmp_path):
    async def scenario():
        async with _t_queue_full(tmp_path) as (link, gate):
            assert link.local_view("t").queue_wait_s == float("inf")
            assert 0 < link.local_view("u").queue_wait_s < float("inf")
            assert link.answer()["queue_full_tenants"] == ["t"]

    asyncio.run(scenario())
