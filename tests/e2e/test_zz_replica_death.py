"""Runs last (file order): kills a decode replica; the session moves and the
pin follows. Serve replaces the replica afterwards.

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


def test_session_moves_when_its_replica_dies(stack):
    """Runs last: it kills a decode replica (Serve replaces it afterwards)."""
    conversation = prompts.make("death", 60)
    victim = chat(stack, conversation, session="sess-death").json()["baton"]["decode_replica"]
    stack.kill_replica("decode", victim)
    time.sleep(stack.cfg["routing"]["replica_timeout_s"] + 1.5)  # heartbeat goes stale, pin (TTL 10 s) stays
    r = chat(stack, conversation, session="sess-death").json()["baton"]
    assert r["decode_replica"] != victim
    metrics = urllib.request.urlopen(f"{stack.url}/metrics", timeout=10).read().decode()
    line = next(x for x in metrics.splitlines() if x.startswith('baton_repins_total{pool="decode"}'))
    assert float(line.split()[-1]) >= 1


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
