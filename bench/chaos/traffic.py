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

MAX_PROMPT_CHARS = 2000
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
        self.turns: dict[int, tuple[int, str]] = {}  # session slot -> (its session's number, its prompt)
        self.attempts: list[Attempt] = []

    def _turn(self) -> tuple[str | None, str]:
        """The next request's session (None for a one-off prompt) and prompt. A session's prompt
        grows turn by turn; once it would pass MAX_PROMPT_CHARS the session ends and a new one
        takes its slot (`chaos-<slot>.<n>`), so the load stays the same over a run and every turn
        continues its session's whole earlier prompt, as an agent's does. (A prompt cut to its
        last characters instead changed from its first token on: the turn then held nothing on
        its replica, and sessions moved for that, about half of them after 6 s of traffic.)"""
        words = " ".join(self.rng.choice(WORDS) for _ in range(40))
        if self.rng.random() >= self.session_share:
            return None, words
        slot = self.rng.randrange(self.sessions)
        generation, text = self.turns.get(slot, (0, ""))
        if len(text) + 1 + len(words) > MAX_PROMPT_CHARS:
            generation, text = generation + 1, ""
        self.turns[slot] = generation, (text + " " + words).strip()
        return f"chaos-{slot}.{generation}", self.turns[slot][1]

    def _next(self, client: httpx.AsyncClient):
        """The next request of the mix, as a coroutine."""
        stream = self.rng.random() < self.stream_share
        session, prompt = self._turn()
        return self._one(client, stream, session, prompt)

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
