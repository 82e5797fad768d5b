"""Load-generator workloads and their statistics, without any network.

A workload is a list of `RequestSpec`: what to POST, where, and when. The
driver in `bench.load.load` sends them and hands back one `RequestResult`
each; `summarize` turns those into one dict. Time is always passed in, so
everything here is deterministic for a given seed.

Workloads:

- ``trace``: the Mooncake conversation trace. Each hash id (512 tokens in the
  trace) becomes a block of ``tokens_per_block`` pseudo-random token ids
  seeded by the id, so equal hash ids give equal token prefixes and the
  server's prefix cache sees the sharing the trace describes. Lengths are
  scaled by the same factor and capped to fit ``max_model_len``.
- ``prefill-heavy`` / ``decode-heavy``: token-id prompts of about 1500 / 64
  tokens with 16 / 256 output tokens.
- ``agentic``: sessions of chat turns; each turn waits for the previous
  answer and resends the whole conversation (see `RequestSpec.chat_history`).
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterable, AsyncIterator, Iterable, Sequence

from common.constants import CORPUS, SESSION_HEADER, TRACE_BLOCK_TOKENS
from common.stats import percentile

VOCAB_LOW, VOCAB_HIGH = 6, 1000  # token ids that are plain text in the tiny model
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
SYNTHETIC = ("prefill-heavy", "decode-heavy", "agentic")


@dataclass(frozen=True)
class RequestSpec:
    """One request to send; the driver adds ``model`` and the stream fields.

    ``at_s`` is the earliest send time in seconds after the run starts. With
    ``chat_history`` the body's ``messages`` are only this turn's new ones:
    the driver waits for turn ``turn - 1`` of the same session, then sends the
    conversation so far (answers included) followed by them, ``think_s``
    after that answer arrived.
    """

    index: int
    at_s: float
    endpoint: str
    body: dict
    headers: dict[str, str] = field(default_factory=dict)
    session_id: str | None = None
    turn: int = 0
    chat_history: bool = False
    think_s: float = 0.0
    input_tokens: int | None = None  # None where the server's template decides
    output_tokens: int = 0


@dataclass
class RequestResult:
    """What one request measured. Times are seconds; NaN where undefined."""

    index: int
    session_id: str | None = None
    turn: int = 0
    sent_s: float = math.nan  # when it was sent, after the run started
    ttft_s: float = math.nan  # to the first non-empty text delta
    tpot_s: float = math.nan  # (last delta - first delta) / (output tokens - 1)
    e2e_s: float = math.nan
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    baton: dict | None = None  # the answer's `baton` object (route, replicas), when the server is Baton

    @property
    def ok(self) -> bool:
        return self.error is None


# -- arrivals and sessions ------------------------------------------------------


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """``n`` arrival times (s) of a Poisson process with ``rate`` per second."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def detect_sessions(hash_id_lists: Iterable[Sequence[int]]) -> list[str]:
    """A session id per request, in order: ``s0``, ``s1``, ...

    A request sharing its first two blocks with an earlier one (it extends
    that conversation: block 0 is the system prompt every request shares)
    joins that request's session; any other request opens a new one.
    """
    by_key: dict[tuple[int, ...], str] = {}
    out: list[str] = []
    opened = 0
    for ids in hash_id_lists:
        key = tuple(ids[:2])
        sid = by_key.get(key) if len(key) == 2 else None
        if sid is None:
            sid = f"s{opened}"
            opened += 1
            if len(key) == 2:
                by_key[key] = sid
        out.append(sid)
    return out


def block_tokens(hash_id: int, tokens_per_block: int, salt: int = 0) -> list[int]:
    """The token ids standing for one trace block; a pure function of its id."""
    rng = random.Random(hash_id * 1_000_003 + salt)
    return [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(tokens_per_block)]


# -- workloads --------------------------------------------------------------------


def trace_workload(path: str | Path, limit: int | None = None, time_scale: float = 1.0,
                   tokens_per_block: int = 16, output_scale: float | None = None,
                   max_output_tokens: int = 256, max_model_len: int = 2048,
                   session_header: bool = True, salt: int = 0) -> list[RequestSpec]:
    """Replays the first ``limit`` trace lines against /v1/completions.

    Arrival = (timestamp - first timestamp) * ``time_scale``. Input and output
    lengths are multiplied by ``tokens_per_block / 512`` (``output_scale``
    overrides that for outputs); output is capped at ``max_output_tokens``
    and the prompt at ``max_model_len - output``. The session header goes
    on requests of sessions with more than one request (unless turned off).
    """
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if limit is not None and len(rows) >= limit:
                break
            if line.strip():
                rows.append(json.loads(line))
    rows.sort(key=lambda r: r["timestamp"])
    scale = tokens_per_block / TRACE_BLOCK_TOKENS
    out_scale = scale if output_scale is None else output_scale
    sessions = detect_sessions(r["hash_ids"] for r in rows)
    sizes = Counter(sessions)
    blocks: dict[int, list[int]] = {}
    t0 = rows[0]["timestamp"] if rows else 0
    specs = []
    for i, (row, sid) in enumerate(zip(rows, sessions)):
        max_tokens = max(1, min(max_output_tokens, round(row["output_length"] * out_scale)))
        n_in = max(1, min(max_model_len - max_tokens, round(row["input_length"] * scale)))
        prompt: list[int] = []
        for h in row["hash_ids"]:
            if len(prompt) >= n_in:
                break
            if h not in blocks:
                blocks[h] = block_tokens(h, tokens_per_block, salt)
            prompt.extend(blocks[h])
        while len(prompt) < n_in:  # the trace has fewer blocks than tokens: pad deterministically
            prompt.extend(block_tokens(-1 - i, tokens_per_block, salt))
        headers = {SESSION_HEADER: sid} if session_header and sizes[sid] > 1 else {}
        specs.append(RequestSpec(
            index=i, at_s=(row["timestamp"] - t0) / 1000.0 * time_scale, endpoint=COMPLETIONS,
            body={"prompt": prompt[:n_in], "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
            headers=headers, session_id=sid, input_tokens=n_in, output_tokens=max_tokens))
    return specs


def synthetic_workload(kind: str, n: int, rate: float | None = None, seed: int = 0,
                       input_tokens: int | None = None, output_tokens: int | None = None,
                       turns: int = 4, think_s: float = 0.0, session_header: bool = True,
                       max_model_len: int = 2048, words: Sequence[str] | None = None) -> list[RequestSpec]:
    """``n`` requests (``agentic``: ``n`` sessions of ``turns`` turns).

    Arrivals are Poisson at ``rate`` per second (sessions per second for
    agentic), or all at 0 when ``rate`` is None (closed loop: the driver's
    concurrency cap sets the load). Input lengths vary by +-10% around the
    kind's default; agentic inputs count words per user turn.
    """
    if kind not in SYNTHETIC:
        raise ValueError(f"unknown workload {kind!r}; expected one of {', '.join(SYNTHETIC)}")
    defaults = {"prefill-heavy": (1500, 16), "decode-heavy": (64, 256), "agentic": (120, 64)}[kind]
    mean_in = input_tokens or defaults[0]
    max_tokens = output_tokens or defaults[1]
    rng = random.Random(seed)
    starts = poisson_arrivals(n, rate, seed) if rate else [0.0] * n
    specs: list[RequestSpec] = []
    if kind != "agentic":
        for i, at in enumerate(starts):
            n_in = min(max_model_len - max_tokens, max(1, round(mean_in * rng.uniform(0.9, 1.1))))
            prompt = [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(n_in)]
            specs.append(RequestSpec(
                index=i, at_s=at, endpoint=COMPLETIONS,
                body={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
                input_tokens=n_in, output_tokens=max_tokens))
        return specs
    vocab = list(words) if words is not None else CORPUS.read_text().split()
    for s, at in enumerate(starts):
        sid = f"agent-{seed}-{s}"
        for t in range(turns):
            n_words = max(1, round(mean_in * rng.uniform(0.9, 1.1)))
            text = f"Session {s} turn {t}. " + " ".join(rng.choice(vocab) for _ in range(n_words))
            specs.append(RequestSpec(
                index=len(specs), at_s=at, endpoint=CHAT,
                body={"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                      "temperature": 0, "ignore_eos": True},
                headers={SESSION_HEADER: sid} if session_header else {}, session_id=sid, turn=t,
                chat_history=True, think_s=think_s if t else 0.0, output_tokens=max_tokens))
    return specs


# -- statistics -------------------------------------------------------------------


async def sse_events(lines: AsyncIterable[str | bytes]) -> AsyncIterator[dict]:
    """The JSON events of an OpenAI SSE stream, given its lines, up to `[DONE]`."""
    async for raw in lines:
        line = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw).strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def choice_text(choice: dict) -> str | None:
    """The text one streamed choice adds (chat delta content or completion text)."""
    return (choice.get("delta") or {}).get("content") or choice.get("text")


def within_slo(r: RequestResult, slo_ttft_s: float, slo_tpot_s: float) -> bool:
    """Succeeded, TTFT <= SLO and TPOT <= SLO (single-token answers have no TPOT)."""
    return r.ok and r.ttft_s <= slo_ttft_s and (math.isnan(r.tpot_s) or r.tpot_s <= slo_tpot_s)


def summarize(results: Sequence[RequestResult], slo_ttft_s: float, slo_tpot_s: float,
              wall_s: float) -> dict:
    """One dict of run statistics. Latency percentiles cover successful requests;
    goodput is the share of all requests that met both SLOs."""
    ok = [r for r in results if r.ok]
    good = sum(within_slo(r, slo_ttft_s, slo_tpot_s) for r in results)
    wall = max(wall_s, 1e-9)

    def pct(attr: str, q: float) -> float | None:
        v = percentile([getattr(r, attr) for r in ok], q)
        return None if v is None else round(v, 6)

    return {
        "requests": len(results), "completed": len(ok), "errors": len(results) - len(ok),
        "wall_s": round(wall_s, 3),
        "requests_per_s": round(len(ok) / wall, 4),
        "input_tokens_per_s": round(sum(r.input_tokens for r in ok) / wall, 2),
        "output_tokens_per_s": round(sum(r.output_tokens for r in ok) / wall, 2),
        "ttft_p50_s": pct("ttft_s", 50), "ttft_p90_s": pct("ttft_s", 90), "ttft_p99_s": pct("ttft_s", 99),
        "tpot_p50_s": pct("tpot_s", 50), "tpot_p90_s": pct("tpot_s", 90),
        "e2e_p50_s": pct("e2e_s", 50), "e2e_p99_s": pct("e2e_s", 99),
        "cached_token_share": round(sum(r.cached_tokens for r in ok) / max(1, sum(r.input_tokens for r in ok)), 4),
        "slo_ttft_s": slo_ttft_s, "slo_tpot_s": slo_tpot_s,
        "goodput": round(good / len(results), 4) if results else None,
        "goodput_requests_per_s": round(good / wall, 4),
    }
