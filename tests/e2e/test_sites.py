"""Two sites (issue 35): a full site sends work to a near one, streamed back, admitted once.

Site `a` and site `b` are two Baton stacks (colocated, one replica each) that
reach each other through delay proxies (bench/sites/delay_proxy.py, 10 ms each way),
as two sites a few hundred kilometres apart would. `a` has one engine permit,
so a second request finds it full. Both stacks start once for the module, in
parallel.

Site `b` also speculates (n-gram prompt lookup, common/config/spec.py) and `a`
does not, as sites with different configs would; the last tests use the pair
as speculation's end-to-end check: greedy answers equal with and without it,
and b's acceptance counters move.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from deployments.api.api_keys import hash_key
from tests.e2e import prompts

KEY = "sites-key"
TOKEN = "site-token-for-tests"
DELAY_S = 0.01
TTL_S = 3.0


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    from bench.common.stack import StackProcess
    from bench.sites.site_mesh import delay_mesh, site_config
    from common.processes import free_ports

    ports = dict(zip("ab", free_ports(2)))
    proxies = delay_mesh(ports, lambda src, dst: DELAY_S)
    stacks = {}
    for name in "ab":
        workdir = tmp_path_factory.mktemp(f"site-{name}")
        (workdir / "site_token").write_text(TOKEN)
        # Lookups from one token, so that short answers are drafted too.
        spec = {"speculation": {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3}}
        stacks[name] = StackProcess(site_config(
            workdir, name, ports, proxies, 1 if name == "a" else 4, 8, workdir / "site_token",
            decode=spec if name == "b" else {}, serve={"api_keys": {hash_key(KEY): "tenant-s"}},
            # The probes cross a Python delay proxy on a loaded 2-core machine: their round trip
            # can pass the default 80 ms "near" bound; these tests are about forwarding, not the
            # bound (unit-tested in test_site_select.py).
            sites={"map_ttl_s": TTL_S, "select": {"near_max_rtt_s": 1.0}}))
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda s: s.start(), stacks.values()))
    yield stacks, proxies
    with ThreadPoolExecutor(2) as pool:  # both at once, as they started
        codes = list(pool.map(lambda s: s.stop(), stacks.values()))
    assert codes == [0, 0], [s.tail() for s in stacks.values()]
    for p in proxies.values():
        p.close()


def _probe(stack, token: str | None = TOKEN) -> httpx.Response:
    return httpx.get(f"{stack.url}/baton/site", headers={"x-baton-site-token": token} if token else {}, timeout=10)


def _admitted(stack) -> float:
    text = httpx.get(f"{stack.url}/metrics", timeout=10).text
    m = re.search(r'^baton_admitted_total\{tenant="tenant-s"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def _decisions(stack) -> list[str]:
    text = httpx.get(f"{stack.url}/metrics", timeout=10).text
    return re.findall(r'^baton_site_decisions_total\{.*$', text, re.M)


def _chat(stack, text: str, max_tokens: int, stream: bool = False, **headers) -> httpx.Response:
    body = {"model": "baton-tiny", "messages": prompts.make(text, 20), "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": stream}
    return httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=120,
                      headers={"authorization": f"Bearer {KEY}", **headers})


def _wait_map(stack, peer: str, present: bool, timeout_s: float = 20) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answer = _probe(stack).json()
        if (peer in answer["rtt_s"]) == present:
            return answer
        time.sleep(0.25)
    raise AssertionError(f"{peer} {'never joined' if present else 'never left'} the map: {answer}")


def test_probes_measure_the_round_trip_and_need_the_site_token(sites):
    stacks, _ = sites
    answer = _wait_map(stacks["a"], "b", present=True)
    assert answer["site"] == "a" and answer["permits_total"] == 1
    assert 2 * DELAY_S <= answer["rtt_s"]["b"] < 1.0
    assert _probe(stacks["a"], token="wrong").status_code == 401
    assert _probe(stacks["a"], token=None).status_code in (401, 404)


def test_a_forwarded_request_must_carry_the_site_token(sites):
    stacks, _ = sites
    for token in (None, "wrong"):
        headers = {"x-baton-site-origin": "a", "x-baton-site-tenant": "someone-else"}
        if token:
            headers["x-baton-site-token"] = token
        r = _chat(stacks["b"], "bypass", 4, **headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_site_token"


def test_a_full_site_streams_from_its_neighbour_and_admits_once(sites):
    stacks, _ = sites
    _wait_map(stacks["a"], "b", present=True)
    before = {n: _admitted(s) for n, s in stacks.items()}
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(_chat, stacks["a"], "hold the only permit", 400)
        deadline = time.monotonic() + 30
        while _probe(stacks["a"]).json()["permits_free"] != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        with httpx.stream("POST", f"{stacks['a'].url}/v1/chat/completions", timeout=120,
                          headers={"authorization": f"Bearer {KEY}"},
                          json={"model": "baton-tiny", "messages": prompts.make("spill", 20), "max_tokens": 8,
                                "temperature": 0, "ignore_eos": True, "stream": True}) as r:
            assert r.status_code == 200
            assert r.headers.get("x-baton-site") == "b", (_probe(stacks["a"]).json(), _decisions(stacks["a"]))
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert long.result().status_code == 200
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content") is not None) >= 2
    # Each request took one permit, at the site that ran it: the long one at a, the spilled one at b.
    assert _admitted(stacks["a"]) - before["a"] == 1
    assert _admitted(stacks["b"]) - before["b"] == 1


def test_a_dead_site_loses_nothing_and_rejoins_the_map(sites):
    stacks, proxies = sites
    proxies[("a", "b")].close()  # b is gone, as a's fronts see it
    with ThreadPoolExecutor(4) as pool:
        # Queued behind a's one permit, with a deadline they can meet however slow the machine
        # (admission refuses at once a request its estimate says would miss the default one).
        answers = list(pool.map(lambda i: _chat(stacks["a"], f"while b is away {i}", 8,
                                                **{"x-baton-deadline-s": "120"}), range(4)))
    assert [r.status_code for r in answers] == [200] * 4  # queued here: none sent to b, none lost
    assert not any(r.headers.get("x-baton-site") for r in answers)
    _wait_map(stacks["a"], "b", present=False, timeout_s=TTL_S + 10)
    proxies[("a", "b")].start()
    _wait_map(stacks["a"], "b", present=True)


ECHO = "Tool result: status ok, items one two three, owner alpha beta gamma."


def _echo_chat(stack, i: int) -> httpx.Response:
    """A greedy turn after an earlier answer: the assistant header at the end of the prompt occurs
    earlier too, so n-gram lookup has something to propose whatever the model says."""
    messages = [{"role": "user", "content": f"{i}. {ECHO} Repeat it."}, {"role": "assistant", "content": ECHO},
                {"role": "user", "content": "Again, please."}]
    body = {"model": "baton-tiny", "messages": messages, "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    return httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=120,
                      headers={"authorization": f"Bearer {KEY}"})


def _metric(stack, name: str) -> float | None:
    m = re.search(rf'^{name}\{{pool="decode"\}} (\S+)$', httpx.get(f"{stack.url}/metrics", timeout=10).text, re.M)
    return float(m.group(1)) if m else None


def test_greedy_answers_are_the_same_with_speculation(sites):
    """b speculates, a does not: each answers the same prompts greedily, token for token."""
    stacks, _ = sites
    for i in range(4):
        answers = [_echo_chat(stacks[name], i) for name in "ab"]
        for r in answers:
            assert r.status_code == 200 and not r.headers.get("x-baton-site"), r.text  # served where sent
        assert answers[0].json()["choices"][0]["message"] == answers[1].json()["choices"][0]["message"]


def test_speculation_counters_move_on_the_site_that_speculates(sites):
    stacks, _ = sites
    before = _metric(stacks["b"], "baton_spec_drafts_total")
    assert _echo_chat(stacks["b"], 9).status_code == 200
    drafts = _metric(stacks["b"], "baton_spec_drafts_total")
    proposed, accepted = (_metric(stacks["b"], f"baton_spec_{k}_tokens_total") for k in ("draft", "accepted"))
    assert drafts > before, "b proposed no drafts"
    assert 0 <= accepted <= proposed
    assert _metric(stacks["a"], "baton_spec_drafts_total") is None  # a does not speculate
