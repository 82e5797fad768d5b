"""The modelled GPU's view of its sequences: which tokens each step computes and what it samples.

Pure (no vLLM, torch or Ray import, no clock), so the timed executor's
bookkeeping is unit-tested with plain values: `Sequences.plan` takes what
vLLM's scheduler sent for one step (new requests with their prompts, the
computed-token counts of the others, the tokens scheduled per request and
the finished ones) and returns the step's `StepShape` for the profile and the
requests that sample a token; `draw` gives a request its next token.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from actors.sim.profile import StepShape

_MUL, _INC = 6364136223846793005, 1442695040888963407


@dataclass
class NewSeq:
    """A request the scheduler sends for the first time (or again, after a preemption)."""

    req_id: str
    prompt: list[int]
    num_computed: int
    seed: int | None = None
    stop: set[int] = field(default_factory=set)


class _Seq:
    __slots__ = ("prompt", "known", "drawn", "state", "stop")

    def __init__(self, new: NewSeq):
        self.prompt = new.prompt
        self.known = len(new.prompt)  # prompt + tokens sampled so far
        self.drawn = 0
        self.stop = new.stop
        self.state = (new.seed if new.seed is not None else zlib.crc32(repr(new.prompt[:256]).encode())) or 1

    def next_state(self) -> int:
        self.state = (self.state * _MUL + _INC) % 2**64
        return self.state >> 33


class Sequences:
    """Every live request's tokens as the modelled GPU knows them. `echo`: sampled tokens copy the prompt
    cyclically; otherwise they are seeded pseudo-random ids below `vocab`. Stop tokens are never drawn."""

    def __init__(self, vocab: int, echo: bool = False):
        self.vocab, self.echo = vocab, echo
        self.seqs: dict[str, _Seq] = {}

    def plan(self, new: list[NewSeq], cached: dict[str, int], scheduled: dict[str, int],
             finished: set[str] = frozenset()) -> tuple[StepShape, set[str]]:
        """Forgets `finished`, adds `new`, and for the step that computes `scheduled[req]` tokens of each
        request (`cached`: computed tokens of requests already known) returns the step's shape and the
        requests whose computation reaches their last known token (those sample one). A request whose one
        scheduled token is its last known token, past its prompt, is decoding; anything else is a prompt
        chunk (a resumed request recomputes its outputs as prompt)."""
        for req_id in finished:
            self.seqs.pop(req_id, None)
        computed = dict(cached)
        for n in new:
            self.seqs[n.req_id] = _Seq(n)
            computed[n.req_id] = n.num_computed
        shape, finishing = StepShape(), set()
        for req_id, n in scheduled.items():
            seq, c0 = self.seqs[req_id], computed[req_id]
            if n == 1 and c0 + 1 == seq.known and c0 >= len(seq.prompt):
                shape.decode_ctx.append(c0 + 1)
            else:
                shape.prefill.append((c0, c0 + n))
            if c0 + n >= seq.known:
                finishing.add(req_id)
        return shape, finishing

    def draw(self, req_id: str, allowed=None) -> int:
        """The request's next token (and counts it as known): from `allowed` (token ids a grammar permits,
        ascending) when given, a stop token only if it is all the grammar permits."""
        seq = self.seqs[req_id]
        seq.known += 1
        seq.drawn += 1
        if allowed is not None:
            free = [t for t in allowed if t not in seq.stop]
            pick = seq.next_state()
            return free[pick % len(free)] if free else (allowed[0] if len(allowed) else 0)
        for _ in range(64):
            if self.echo and seq.prompt:
                tok = seq.prompt[(seq.drawn - 1) % len(seq.prompt)]
                seq.drawn += tok in seq.stop
            else:
                tok = seq.next_state() % self.vocab
            if tok not in seq.stop:
                return tok
        return 0

    def clear(self) -> None:
        self.seqs.clear()
