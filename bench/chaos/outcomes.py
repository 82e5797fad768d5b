"""What each request ended as around a fault, and when goodput came back. Pure: times are passed in.

A request ends as one of `OUTCOMES`:
- `ok`: a whole answer (a finish reason);
- `retried`: a whole answer that Baton ran again after a replica failed (its
  `baton.retried_after`), which the client did not see;
- `clean_error`: an error the client can act on: a 4xx/5xx with an
  OpenAI-style JSON body, or a stream that ends with an error event;
- `unclean_error`: an error status whose body is not OpenAI's shape;
- `dropped`: the connection failed before any response;
- `broken`: the connection broke mid-answer (the client gets a transport
  error: the front that held it died);
- `hung`: no byte for longer than the deadline (the client gave up);
- `truncated`: an answer that ended cleanly with no finish reason and no
  error: a silent cut.
`dropped` and `broken` are failures the client sees; `SILENT` ones (and an
error that is not OpenAI's shape) are what a fault must never cause.

`routing` says whether routing recovered: how often the index's prediction
was the engine's cached tokens before the fault and after the component came
back, and whether sessions stayed on one replica again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

OUTCOMES = ("ok", "retried", "clean_error", "unclean_error", "dropped", "broken", "hung", "truncated")
BAD = ("unclean_error", "dropped", "broken", "hung", "truncated")
SILENT = ("unclean_error", "hung", "truncated")


@dataclass
class Attempt:
    """One request as the client saw it (times: the load's monotonic clock)."""

    stream: bool
    sent: float
    session: str | None = None
    status: int | None = None
    first_byte: float | None = None
    ended: float | None = None
    hung: bool = False
    body: bytes = b""
    error: str | None = None  # the transport error the client got, if any

    def outcome(self) -> str:
        """Which of OUTCOMES this request ended as; changes nothing."""
        if self.hung:
            return "hung"
        if self.status is None:
            return "dropped"
        if self.status != 200:
            return "clean_error" if _error_body(self.body) else "unclean_error"
        events = _sse(self.body) if self.stream else [_json(self.body)]
        if any(isinstance(e, dict) and "error" in e for e in events):
            return "clean_error"
        finished = any(isinstance(e, dict) and any(c.get("finish_reason") for c in e.get("choices") or [])
                       for e in events)
        if not finished or (self.stream and not self.body.rstrip().endswith(b"data: [DONE]")):
            return "broken" if self.error else "truncated"
        retried = any(isinstance(e, dict) and (e.get("baton") or {}).get("retried_after") for e in events)
        return "retried" if retried else "ok"

    def baton(self) -> dict:
        """The answer's `baton` object (a plain answer's, or a stream's last event's); {} if none."""
        events = _sse(self.body) if self.stream else [_json(self.body)]
        found = [e["baton"] for e in events if isinstance(e, dict) and isinstance(e.get("baton"), dict)]
        return found[-1] if found else {}


def _json(raw: bytes):
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _error_body(raw: bytes) -> bool:
    doc = _json(raw)
    return isinstance(doc, dict) and isinstance(doc.get("error"), dict) and "message" in doc["error"]


def _sse(raw: bytes) -> list:
    out = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
            out.append(_json(line[6:]))
    return out


def counts(attempts: list[Attempt]) -> dict[str, int]:
    """How many attempts ended as each outcome (every outcome named, zeros included)."""
    out = dict.fromkeys(OUTCOMES, 0)
    for a in attempts:
        out[a.outcome()] += 1
    return out


def failures(attempts: list[Attempt], killed_at: float, most: int = 5) -> list[dict]:
    """What the first `most` requests that were not answered saw, for reading why: outcome, status,
    streamed, when sent and ended (seconds from the kill), and the tail of the body."""
    bad = [a for a in attempts if a.outcome() not in ("ok", "retried")][:most]
    return [{"outcome": a.outcome(), "status": a.status, "stream": a.stream, "error": a.error,
             "sent_s": round(a.sent - killed_at, 3), "ended_s": a.ended and round(a.ended - killed_at, 3),
             "body": a.body[-300:].decode(errors="replace")} for a in bad]


def _before(done: list[float], fault_at: float, before_s: float) -> float:
    """Goodput (answers ended per second, `done`) over the `before_s` before `fault_at`."""
    return sum(1 for t in done if fault_at - before_s <= t < fault_at) / before_s


def _windows(done: list[float], fault_at: float, end: float, before: float, window_s: float,
             share: float, step_s: float):
    """(t, good) for each `window_s` window from `fault_at` that ends by `end`, stepped `step_s`:
    good when its goodput is at least `share` of `before`."""
    t = fault_at
    while t + window_s <= end:
        yield t, sum(1 for d in done if t <= d < t + window_s) / window_s >= share * before
        t += step_s


def goodput_back_s(done: list[float], fault_at: float, end: float, before_s: float = 10.0,
                   window_s: float = 3.0, share: float = 0.9, step_s: float = 0.25) -> float | None:
    """Seconds after `fault_at` until goodput (answers ended per second, `done`) over a `window_s`
    window is back to `share` of its mean over the `before_s` before the fault; None if it never
    is by `end`. 0.0 when it never dropped below that."""
    before = _before(done, fault_at, before_s)
    if before == 0:
        return None
    windows = _windows(done, fault_at, end, before, window_s, share, step_s)
    return next((round(t - fault_at, 2) for t, good in windows if good), None)


def goodput_settled_s(done: list[float], fault_at: float, until: float, before_s: float = 10.0,
                      window_s: float = 3.0, share: float = 0.9, step_s: float = 0.25) -> float | None:
    """Seconds after `fault_at` from which goodput over every `window_s` window up to `until` (the
    traffic's last send) stays at `share` of its mean over the `before_s` before the fault: the end
    of the last dip, where `goodput_back_s` gives the end of the first (a fault whose effect
    starts late, a lost site whose load its peer takes on, dips after a first good window).
    0.0 when it never dropped below; None when it is below in the last window."""
    before = _before(done, fault_at, before_s)
    if before == 0:
        return None
    settled = fault_at
    for t, good in _windows(done, fault_at, until, before, window_s, share, step_s):
        if not good:
            settled = None
        elif settled is None:
            settled = t
    return None if settled is None else round(settled - fault_at, 2)


def timeline(attempts: list[Attempt], start: float, end: float, bin_s: float = 1.0) -> dict[str, list[int]]:
    """Per `bin_s` bin from `start`: answers ended well (`good`) and ended badly or in error (`bad`)."""
    n = max(1, int((end - start) / bin_s) + 1)
    good, bad = [0] * n, [0] * n
    for a in attempts:
        at = a.ended if a.ended is not None else a.sent
        i = int((at - start) / bin_s)
        if 0 <= i < n:
            (good if a.outcome() in ("ok", "retried") else bad)[i] += 1
    return {"good": good, "bad": bad}


def prediction(info: dict) -> str | None:
    """`exact`, `over` or `under`: the index's predicted cached tokens against what the engine
    that computed the prompt found (the rule of the front's metrics); None where the index
    did not route the request."""
    predicted = info.get("predicted_cached_tokens")
    if predicted is None:
        return None
    actual = info.get("decode_cached_tokens", 0) if info.get("decode_only") else (info.get("prefill_cached_tokens") or 0)
    return "exact" if predicted == actual else "over" if predicted > actual else "under"


def _predictions(infos: list[dict]) -> dict[str, int]:
    preds = [p for p in map(prediction, infos) if p is not None]
    return {k: preds.count(k) for k in ("exact", "over", "under")}


def _exact_share(counted: dict[str, int]) -> float | None:
    n = sum(counted.values())
    return round(counted["exact"] / n, 4) if n else None


def routing(attempts: list[Attempt], killed_at: float, back_at: float | None) -> dict:
    """Whether routing recovered from a fault at `killed_at` whose component was back at `back_at`:
    the share of answered requests whose index prediction was exact, among those sent before the
    kill and those sent after the component was back (`index_before`, `index_after`: how many
    were exact, over and under); and `sessions_kept_after`, the share of session turns sent
    after it whose replica was their session's previous turn's (a session moved off a dead
    replica counts once), with `sessions_kept_before`, the same share before the kill (what the
    routing keeps without a fault)."""
    answered = sorted(((a, a.baton()) for a in attempts if a.outcome() in ("ok", "retried")),
                      key=lambda pair: pair[0].sent)
    after = [(a, info) for a, info in answered if back_at is not None and a.sent >= back_at]
    last: dict[str, str] = {}
    kept = turns = kept_before = turns_before = 0
    for a, info in answered:
        replica = info.get("decode_replica")
        if a.session is None or replica is None:
            continue
        if back_at is not None and a.sent >= back_at and a.session in last:
            turns += 1
            kept += last[a.session] == replica
        elif a.sent < killed_at and a.session in last:
            turns_before += 1
            kept_before += last[a.session] == replica
        last[a.session] = replica
    before = _predictions([info for a, info in answered if a.sent < killed_at])
    later_counts = _predictions([info for _, info in after])
    return {"index_exact_before": _exact_share(before), "index_exact_after": _exact_share(later_counts),
            "index_before": before, "index_after": later_counts,
            "sessions_kept_before": round(kept_before / turns_before, 4) if turns_before else None,
            "sessions_kept_after": round(kept / turns, 4) if turns else None}
