"""Steady mixed traffic against one endpoint, recorded as the client saw it (outcomes.Attempt).

Poisson arrivals of chat requests: a share streamed, the rest not; each turn of
one of `sessions` agent sessions (`x-session-affinity`, its prompt growing turn
by turn) or, for a share, a one-off prompt. Every request has a deadline for
each byte: a request that sees no byte for `deadline_s` is cancelled and counted
as hung. Nothing is retried by the client.
"""

from __future__ import annotations

import asyncio
import random
import time

import httpx

from bench.chaos.outcomes import Attempt

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda omicron sigma tau upsilon "
         "omega river stone cloud ember harbor lantern meadow orbit pillar quartz").split()


class Traffic:
    """One load generator; `attempts` grows as requests end."""

    def __init__(self, url: str, model: str, rate: float, sessions: int = 16, stream_share: float = 0.5,
                 session_share: float = 0.7, max_tokens: int = 16, deadline_s: float = 30.0,
                 api_key: str | None = None, seed: int = 0):
        self.url, self.model, self.rate = url, model, rate
        self.sessions, self.stream_share, self.session_share = sessions, stream_share, session_share
        self.max_tokens, self.deadline_s = max_tokens, deadline_s
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.rng = random.Random(seed)
        self.turns: dict[str, str] = {}
        self.attempts: list[Attempt] = []

    def _prompt(self, session: str | None) -> str:
        words = " ".join(self.rng.choice(WORDS) for _ in range(40))
        if session is None:
            return words
        # A session's prompt grows turn by turn up to a bound, so the load stays the same over a run.
        self.turns[session] = (self.turns.get(session, "") + " " + words).strip()[-2000:]
        return self.turns[session]

    def _next(self, client: httpx.AsyncClient):
        """The next request of the mix, as a coroutine."""
        session = f"chaos-{self.rng.randrange(self.sessions)}" if self.rng.random() < self.session_share else None
        return self._one(client, self.rng.random() < self.stream_share, session, self._prompt(session))

    async def run(self, seconds: float) -> None:
        """Sends requests at `rate` for `seconds`, then waits for those in flight (each bounded by its
        deadline)."""
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=None, limits=limits) as client:
            tasks, end = [], time.monotonic() + seconds
            while (now := time.monotonic()) < end:
                tasks.append(asyncio.ensure_future(self._next(client)))
                await asyncio.sleep(min(self.rng.expovariate(self.rate), max(0.0, end - now)))
            await asyncio.gather(*tasks)

    async def closed(self, seconds: float, concurrency: int) -> float:
        """The same mix from `concurrency` clients that each send their next request when the last
        ended, for `seconds`: whole answers per second (the capacity the open load is a share of)."""
        async with httpx.AsyncClient(timeout=None) as client:
            start = time.monotonic()

            async def worker() -> None:
                while time.monotonic() - start < seconds:
                    await self._next(client)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
            took = time.monotonic() - start
        good = sum(1 for a in self.attempts if a.outcome() in ("ok", "retried"))
        self.attempts = []
        return good / took

    def send_one(self, prompt: str, stream: bool = False, session: str | None = None) -> Attempt:
        """Sends one request of this traffic's model and settings from a client of its own, waits for
        its end (bounded by the deadline), and appends it to `attempts`; returns it."""
        async def one() -> None:
            async with httpx.AsyncClient(timeout=None) as client:
                await self._one(client, stream, session, prompt)
        asyncio.run(one())
        return self.attempts[-1]

    async def _one(self, client: httpx.AsyncClient, stream: bool, session: str | None, prompt: str) -> None:
        a = Attempt(stream=stream, sent=time.monotonic(), session=session)
        headers = {**self.headers, **({"x-session-affinity": session} if session else {})}
        body = {"model": self.model, "max_tokens": self.max_tokens, "stream": stream, "temperature": 0,
                "messages": [{"role": "user", "content": prompt}]}
        try:
            await self._read(client, body, headers, a)
        except asyncio.TimeoutError:
            a.hung = True
        except (httpx.HTTPError, OSError) as exc:
            a.error = type(exc).__name__
        a.ended = time.monotonic()
        self.attempts.append(a)

    async def _read(self, client: httpx.AsyncClient, body: dict, headers: dict, a: Attempt) -> None:
        req = client.build_request("POST", f"{self.url}/v1/chat/completions", json=body, headers=headers)
        resp = await asyncio.wait_for(client.send(req, stream=True), self.deadline_s)
        a.status = resp.status_code
        try:
            chunks = resp.aiter_raw()
            while True:
                try:
                    chunk = await asyncio.wait_for(chunks.__anext__(), self.deadline_s)
                except StopAsyncIteration:
                    break
                if a.first_byte is None:
                    a.first_byte = time.monotonic()
                a.body += chunk
        finally:
            await resp.aclose()
