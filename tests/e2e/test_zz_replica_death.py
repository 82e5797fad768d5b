"""Runs last (file order): kills a decode replica; a request forwarded to it
before its first token is retried on another; the session moves and the pin
follows. Serve replaces the replica afterwards.

Each decode replica serves the public port in its own process, as `vllm
serve` does, so a client whose connection the killed replica had accepted
sees that connection close (never a hang). Every other request ends cleanly:
completed, a clean error body, or a stream ended by an error event.
"""

from __future__ import annotations

import time
import urllib.request

from tests.e2e import prompts
from tests.e2e.test_routing import chat


def test_a_request_sent_to_a_dead_replica_is_retried_before_its_first_token(stack):
    """Runs first in this file: it kills a decode replica (Serve replaces it afterwards).

    For up to `routing.replica_timeout_s` after a replica dies, its registry entry
    still looks alive and the session's pin still names it. The test holds that
    window open (it writes the dead replica's last entry back with a fresh time),
    so the front is sure to forward there, find it unreachable before the first
    token, and run the request on another replica: same greedy answer, no error.
    """
    import json

    import redis

    conversation = prompts.make("death", 60)
    first = chat(stack, conversation, session="sess-death", max_tokens=8).json()
    victim = first["baton"]["decode_replica"]
    r = redis.Redis.from_url(stack.cfg["redis"]["url"])
    entry = json.loads(r.hget("baton:replicas:decode", victim))
    stack.kill_replica("decode", victim)
    host, port = entry["url"].rsplit("/", 1)[-1].rsplit(":", 1)
    deadline = time.monotonic() + 30
    while _listening(host.strip("[]"), int(port)):  # gone for good, not dying
        assert time.monotonic() < deadline, "the killed replica still listens"
        time.sleep(0.2)
    r.hset("baton:replicas:decode", victim, json.dumps({**entry, "ts": time.time()}))
    again = chat(stack, conversation, session="sess-death", max_tokens=8).json()
    assert again["baton"]["retried_after"], again["baton"]  # the first attempt went to the dead replica
    assert again["baton"]["decode_replica"] != victim
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]


def test_session_moves_when_its_replica_dies(stack):
    """After the dead replica's entry goes stale, the session's pin moves to a live one."""
    time.sleep(stack.cfg["routing"]["replica_timeout_s"] + 1.5)  # heartbeat goes stale, pin (TTL 10 s) stays
    r = chat(stack, prompts.make("death", 60), session="sess-death").json()["baton"]
    assert r["decode_replica"] in _live_decode(stack)
    metrics = urllib.request.urlopen(f"{stack.url}/metrics", timeout=10).read().decode()
    line = next(x for x in metrics.splitlines() if x.startswith('baton_repins_total{pool="decode"}'))
    assert float(line.split()[-1]) >= 1


def _listening(host: str, port: int) -> bool:
    import socket

    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def _live_decode(stack) -> list[str]:
    import json

    import redis

    raw = redis.Redis.from_url(stack.cfg["redis"]["url"]).hgetall("baton:replicas:decode")
    timeout = stack.cfg["routing"]["replica_timeout_s"]
    return [k.decode() for k, v in raw.items() if time.time() - json.loads(v)["ts"] <= timeout]


def _wait_pool(stack, n: int, timeout_s: float = 420) -> None:
    deadline = time.monotonic() + timeout_s
    while len(_live_decode(stack)) < n and time.monotonic() < deadline:
        time.sleep(2)
    assert len(_live_decode(stack)) >= n, "decode pool did not recover"


def test_requests_in_flight_survive_a_decode_replica_dying(stack):
    import asyncio
    import json

    import httpx

    _wait_pool(stack, 2)  # the replica killed above has been replaced

    async def one(client, i):
        body = {"model": "baton-tiny", "stream": True, "max_tokens": 150, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"in flight {i} " + "word " * 40}]}
        events = []
        try:
            async with client.stream("POST", f"{stack.url}/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    return r.status_code, await r.aread()
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
        except (httpx.RemoteProtocolError, httpx.ReadError):
            return "closed", events  # its front was the replica that died
        return 200, events

    async def main():
        async with httpx.AsyncClient(timeout=httpx.Timeout(120)) as client:
            tasks = [asyncio.create_task(one(client, i)) for i in range(6)]
            await asyncio.sleep(1.0)
            stack.kill_replica("decode", _live_decode(stack)[0])
            return await asyncio.wait_for(asyncio.gather(*tasks), 180)  # nothing hangs

    for status, payload in asyncio.run(main()):
        if status == "closed":
            continue
        if status != 200:  # failed before streaming: a clean error body, never a hang
            assert status in (429, 503, 504) and b"error" in payload
            continue
        assert payload[-1] == "[DONE]"
        last = json.loads(payload[-2])
        # Either it completed, or it ended with an OpenAI-style error event.
        assert "error" in last or last["choices"] == [] or last["choices"][0]["finish_reason"]
    _wait_pool(stack, 2)  # and the pool recovers
    assert chat(stack, prompts.make("after death", 30)).status_code == 200
