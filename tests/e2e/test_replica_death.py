"""Decode replicas die with requests on them (the `destructive` fixture: after every test
that needs the shared stack whole).

Each case is made to happen for certain, not by racing a timer, and every
wait is bounded (nothing may hang). Two kills, one after the other:
1. a stream whose replica dies with the request in its engine's queue (the
   engine core is stopped with SIGSTOP, so no token can come) is run again by
   the front: the client sees only the healthy answer, never the death; then
   a request forwarded to that dead replica (its registry entry kept fresh)
   runs on the front that accepted it, same greedy answer;
2. the session pinned to the dead replica then moves to a live one;
3. once the replica is replaced, a second one dies with two requests on it:
   a stream that has its first token ends with an OpenAI-style error event
   and `[DONE]`; a plain (non-streamed) request, tokens already computed but
   none sent, is run again by the front, which gives the healthy greedy
   answer (request migration).
Replicas die by SIGKILL of their processes (StackProcess.crash), which
returns once they are gone; Serve replaces each.

Each decode replica serves the public port in its own process (SO_REUSEPORT),
so a client whose connection the dying replica accepted sees it close, as with
`vllm serve`. Tests 1 and 3 therefore talk over kept-alive connections that
another replica's front accepted; the fronts' own admitted counts say which.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import redis

from common.constants import SESSION_HEADER as SESSION
from routing.prefix.redis_state import registry_key
from tests.e2e import prompts
from tests.e2e.test_routing import chat

WAIT_S = 120  # the longest any request here may take
QUEUED, MID = "sess-queue", "sess-mid"  # the sessions of the first kill and of the second
_KILLED: dict = {}  # the first kill's victim and its session's messages

pytestmark = pytest.mark.usefixtures("destructive")


def test_a_replica_that_dies_before_its_first_token_costs_its_requests_nothing(stack):
    """1. The victim's engine core is stopped, so the victim accepts a stream (and sends its
    headers) but can produce no token; it is killed once its engine holds the request. The front
    that forwarded it runs it again.
    2. For up to `routing.replica_timeout_s` after a replica dies, its registry entry still looks
    alive, and the session's pin still names it. The test holds that window open (it writes the
    dead replica's last entry back with a fresh time), so the front is sure to forward the
    session's next request there, find it unreachable, and run it itself: same greedy answer,
    no error, one retry counted."""
    _wait_pool(stack, 2)
    messages = prompts.make("death-queue", 60)
    healthy = chat(stack, messages, session=QUEUED, max_tokens=16).json()
    victim = healthy["baton"]["decode_replica"]
    (status, events, front, grew), (again, retried) = asyncio.run(_die_in_queue(stack, victim, messages))
    _KILLED.update(victim=victim, messages=messages)
    assert status == 200, events
    assert grew == {"baton_admitted_total": 1, "baton_retries_total": 1}  # it came through `front`, once retried
    assert events[-1] == "[DONE]", events
    chunks = [json.loads(e) for e in events[:-1]]
    assert not [c for c in chunks if "error" in c], chunks
    baton = chunks[-1]["baton"]  # the usage chunk
    assert baton["route"] == "pinned" and baton["decode_replica"] == front, baton
    # The victim held the request when it died (it was not merely unreachable):
    # with the stream's headers sent, the answer broke before its first byte.
    assert baton["retried_after"] not in (None, "ClientConnectorError"), baton
    assert _text(chunks) == healthy["choices"][0]["message"]["content"]
    assert _finish(chunks) == [healthy["choices"][0]["finish_reason"]]
    # 2. the next request of the session, sent to the dead replica
    baton = again["baton"]
    assert baton["route"] == "pinned" and baton["retried_after"], baton  # it went to the dead replica first
    assert baton["decode_replica"] != victim and retried == 1, (baton, retried)
    assert again["choices"][0]["message"]["content"] == healthy["choices"][0]["message"]["content"]
    assert again["choices"][0]["finish_reason"] == healthy["choices"][0]["finish_reason"]


def test_session_moves_when_its_replica_dies(stack):
    """After the dead replica's entry goes stale, the session's pin moves to a live one."""
    time.sleep(stack.cfg["routing"]["replica_timeout_s"] + 1.5)  # heartbeat goes stale, pin (TTL 10 s) stays
    r = chat(stack, _KILLED["messages"], session=QUEUED).json()["baton"]
    assert r["decode_replica"] in _live_decode(stack)
    line = next(x for x in httpx.get(f"{stack.url}/metrics", timeout=10).text.splitlines()
                if x.startswith('baton_repins_total{pool="decode"}'))
    assert float(line.split()[-1]) >= 1


def test_a_replica_dying_mid_answer_ends_its_stream_with_an_error_and_runs_its_plain_request_again(stack):
    """One kill, two requests of one session on the victim, both through another front:
    - a stream that has its first token: it cannot run again (the client has part of it), so
      the front ends it with an OpenAI-style error event and `[DONE]`;
    - a plain request whose engine has decoded for a second: its client has no byte yet (vLLM
      sends the whole answer at its end), so the front runs it again on its own engine, and
      greedy decoding gives the healthy answer (request migration)."""
    _wait_pool(stack, 2)  # the replica the tests above killed was replaced
    plain = {**_body(prompts.make("death-plain", 30), _decode_tokens(stack, DECODE_S)), "stream": False,
             "ignore_eos": True}
    healthy = httpx.post(f"{stack.url}/v1/chat/completions", json=plain, headers={SESSION: MID}, timeout=WAIT_S)
    victim = healthy.json()["baton"]["decode_replica"]
    stream = {**_body(prompts.make("death-stream", 30), plain["max_tokens"]), "ignore_eos": True}
    status, events, answer, grew = asyncio.run(_die_mid_answers(stack, victim, plain, stream))
    assert grew == {"baton_admitted_total": 2, "baton_retries_total": 1}  # both through `front`, the plain one retried
    assert status == 200, events
    assert events[-1] == "[DONE]", events
    err = json.loads(events[-2])["error"]
    assert err["type"] == "server_error" and err["code"] == "engine_unavailable", err
    chunks = [json.loads(e) for e in events[:-2]]
    assert _text(chunks) and _finish(chunks) == []  # tokens came, then the break, no finish
    assert answer.status_code == 200, answer.text
    body, want = answer.json(), healthy.json()
    assert body["baton"]["retried_after"], body["baton"]
    assert body["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
    assert body["usage"]["completion_tokens"] == want["usage"]["completion_tokens"]


# -- a replica dies under a request -------------------------------------------

async def _die_in_queue(stack, victim: str, messages: list[dict]):
    """Streams `messages` in session QUEUED (pinned to `victim`) through another front while the
    victim's engine core is stopped; once the victim holds the request, kills it, and keeps its
    registry entry fresh from then on. Once the stream ended, sends the session's next request.
    Returns (status, events, the front, how much its admitted and retry counts grew) of the
    stream, and (answer, retries counted) of the next request."""
    client, front = await _client_on_another_front(stack, victim)
    processes = stack.replica_processes("decode", victim)
    assert len(processes) == 2, processes  # the replica and its engine core
    before = _front_counts(stack, front)
    processes[1].suspend()
    try:
        stopped = time.time()
        await asyncio.to_thread(_wait_engine_load, stack, victim, stopped, 0)  # a beat since the stop
        body = {**_body(messages, 16), "stream_options": {"include_usage": True}}
        task = asyncio.create_task(_stream(client, body, QUEUED, None))
        await asyncio.to_thread(_wait_engine_load, stack, victim, stopped, 1)  # the request is in
        entry = _entries(stack)[victim]
    finally:
        stack.crash(processes)
    alive = asyncio.create_task(_seem_alive(stack, victim, entry))
    try:
        status, events = await _ended(client, task)
        streamed = status, events, front, _growth(stack, front, before)
        retries = _own_counts(stack, "baton_retries_total")
        again = (await asyncio.to_thread(chat, stack, messages, session=QUEUED, max_tokens=16)).json()
    finally:
        alive.cancel()
    ran = again.get("baton", {}).get("decode_replica")
    return streamed, (again, _own_counts(stack, "baton_retries_total").get(ran, 0) - retries.get(ran, 0))


async def _seem_alive(stack, replica: str, entry: dict) -> None:
    """Writes `replica`'s registry `entry` back with a fresh time every half second, until
    cancelled: routing takes the dead replica for a live one."""
    with redis.Redis.from_url(stack.cfg["redis"]["url"]) as r:
        while True:
            r.hset(registry_key("decode"), replica, json.dumps({**entry, "ts": time.time()}))
            await asyncio.sleep(0.5)


async def _die_mid_answers(stack, victim: str, plain: dict, stream: dict):
    """Sends `plain` and then streams `stream`, both in session MID (pinned to `victim`), each on a
    connection another front accepted; kills the victim once the stream's first token arrived and
    the plain request has been decoding for a second. Returns the stream's status and events, the
    plain answer, and how much that front's admitted and retry counts grew."""
    (plain_client, front), (stream_client, other) = [await _client_on_another_front(stack, victim)
                                                     for _ in range(2)]
    assert front == other  # two replicas: the one that is not the victim
    processes = stack.replica_processes("decode", victim)
    before = _front_counts(stack, front)
    asked = time.time()
    answering = asyncio.create_task(plain_client.post("/v1/chat/completions", json=plain, headers={SESSION: MID}))
    first = asyncio.Event()
    try:
        await asyncio.to_thread(_wait_engine_load, stack, victim, asked, 1)  # decoding the plain request
        decoding = time.monotonic()
        streaming = asyncio.create_task(_stream(stream_client, stream, MID, first))
        await asyncio.wait_for(first.wait(), WAIT_S)
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - decoding)))  # tokens computed, none sent
        assert not answering.done(), "the plain answer must outlast the kill"
    finally:
        stack.crash(processes)
    status, events = await _ended(stream_client, streaming)
    try:
        answer = await asyncio.wait_for(answering, WAIT_S)
    finally:
        await plain_client.aclose()
    return status, events, answer, _growth(stack, front, before)


# -- helpers ------------------------------------------------------------------

DECODE_S = 6.0  # how long the plain request of the second kill decodes alone: it must outlast the ~1 s to the kill


def _decode_tokens(stack, seconds: float) -> int:
    """The tokens one request decodes alone in about `seconds` on this stack (the difference of two
    lengths leaves the prefill and the fixed costs out), within the model's context."""
    took = {}
    for n in (32, 96):
        body = {**_body(prompts.make("death-rate", 30), n), "stream": False, "ignore_eos": True}
        started = time.monotonic()
        assert httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=WAIT_S).status_code == 200
        took[n] = time.monotonic() - started
    longest = stack.cfg.get("model", {}).get("max_model_len", 2048) - 200
    return min(longest, max(256, int(seconds * 64 / max(took[96] - took[32], 0.01))))


COUNTERS = ("baton_admitted_total", "baton_retries_total")


def _front_counts(stack, front: str) -> dict[str, float]:
    """The front's own admitted and retry counts."""
    return {name: _own_counts(stack, name)[front] for name in COUNTERS}


async def _ended(client: httpx.AsyncClient, task: asyncio.Task) -> tuple[int, list[str]]:
    """(status, events) once the stream `task` ended; closes `client`."""
    try:
        return await asyncio.wait_for(task, WAIT_S)
    finally:
        await client.aclose()


def _growth(stack, front: str, before: dict[str, float]) -> dict[str, float]:
    """How much the front's counts grew since `before`."""
    after = _front_counts(stack, front)
    return {name: after[name] - before[name] for name in COUNTERS}

def _body(messages: list[dict], max_tokens: int) -> dict:
    return {"model": "baton-tiny", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}


async def _stream(client: httpx.AsyncClient, body: dict, session: str, first_token: asyncio.Event | None):
    """(status, the `data:` payloads); sets `first_token` when a content token arrives."""
    events: list[str] = []
    async with client.stream("POST", "/v1/chat/completions", json=body,
                             headers={SESSION: session}) as r:
        if r.status_code != 200:
            return r.status_code, [(await r.aread()).decode()]
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if first_token is not None and events[-1] != "[DONE]" and _text([json.loads(events[-1])]):
                first_token.set()
    return r.status_code, events


async def _client_on_another_front(stack, victim: str, attempts: int = 20):
    """(client, front): an httpx client whose one kept-alive connection the
    front of a live replica other than `victim` accepted. The kernel spreads
    new connections over the replicas; a probe request on each says which
    front took it (the one whose admitted count grew)."""
    for i in range(attempts):
        client = httpx.AsyncClient(base_url=stack.url, timeout=WAIT_S, limits=httpx.Limits(
            max_connections=1, max_keepalive_connections=1, keepalive_expiry=WAIT_S))
        before = _own_counts(stack, "baton_admitted_total")
        r = await client.post("/v1/chat/completions", json={
            "model": "baton-tiny", "max_tokens": 1, "messages": [{"role": "user", "content": f"probe {i}"}]})
        assert r.status_code == 200, r.text
        after = _own_counts(stack, "baton_admitted_total")
        grew = [replica for replica in after if after[replica] > before.get(replica, 0)]
        assert len(grew) == 1, (before, after)
        if grew[0] != victim:
            return client, grew[0]
        await client.aclose()
    raise AssertionError(f"{attempts} connections in a row went to {victim}")


def _text(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))


def _finish(chunks: list[dict]) -> list:
    return [c["choices"][0]["finish_reason"] for c in chunks
            if c.get("choices") and c["choices"][0]["finish_reason"]]


def _entries(stack) -> dict[str, dict]:
    raw = redis.Redis.from_url(stack.cfg["redis"]["url"]).hgetall(registry_key("decode"))
    return {k.decode(): json.loads(v) for k, v in raw.items()}


def _live_decode(stack, entries: dict[str, dict] | None = None) -> list[str]:
    """The decode replicas whose heartbeat is fresh, in `entries` (read now when None)."""
    timeout = stack.cfg["routing"]["replica_timeout_s"]
    entries = _entries(stack) if entries is None else entries
    return [k for k, v in entries.items() if time.time() - v["ts"] <= timeout]


def _own_counts(stack, metric: str) -> dict[str, float]:
    """`metric` summed over its labels in each live decode replica's own metrics
    (its internal /baton/metrics; the public /metrics sums all replicas)."""
    entries, out = _entries(stack), {}  # one read: a replica may register between two
    for replica in _live_decode(stack, entries):
        try:
            text = httpx.get(f"{entries[replica]['url']}/baton/metrics", timeout=10).text
        except httpx.TransportError:
            continue  # dead, its entry not yet stale
        out[replica] = sum(float(line.split()[-1]) for line in text.splitlines()
                           if line.startswith((f"{metric} ", f"{metric}{{")))
    return out


def _wait_engine_load(stack, replica: str, since: float, unfinished: int, timeout_s: float = 30) -> None:
    """Until `replica` beats, after `since`, that its engine holds `unfinished` requests."""
    deadline = time.monotonic() + timeout_s
    while True:
        entry = _entries(stack)[replica]
        if entry["ts"] > since and entry.get("unfinished") == unfinished:
            return
        assert time.monotonic() < deadline, f"{replica}: {entry}"
        time.sleep(0.05)


def _wait_pool(stack, n: int, timeout_s: float = 420) -> None:
    """Until `n` decode replicas answer (a replica killed a moment ago may still look live)."""
    deadline = time.monotonic() + timeout_s
    while len(_own_counts(stack, "baton_admitted_total")) < n and time.monotonic() < deadline:
        time.sleep(0.25)
    assert len(_own_counts(stack, "baton_admitted_total")) >= n, "decode pool did not recover"
