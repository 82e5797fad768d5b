"""`baton bench reject`: the refusing front answers 429 with Retry-After, before the body."""

from __future__ import annotations

import asyncio

from bench.reject import reject


def test_a_full_front_refuses_every_completion_with_retry_after():
    front = reject._front()
    sent: list[dict] = []
    reads = 0

    async def receive():
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": reject._body(), "more_body": False}

    async def send(message):
        sent.append(message)
    scope = {"type": "http", "path": reject.PATH, "method": "POST",
             "headers": [(b"authorization", f"Bearer {reject.KEY}".encode())]}
    asyncio.run(front(scope, receive, send))
    start = sent[0]
    assert start["status"] == 429
    assert dict(start["headers"])[b"retry-after"].isdigit()
    assert reads == 0  # refused before the body was read


def test_in_process_measurement_reports_microseconds():
    out = asyncio.run(reject._in_process(50))
    assert out["reject_us"] > 0 and out["skipped_parse_us"] > 0
