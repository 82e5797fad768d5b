"""The conversation trace on N simulated engines: Baton's policy against round robin, exact times.

The public Mooncake conversation trace (`../shared/traces/`, a copy in
bench/traces/) gives each request's arrival, input and output length and
its prompt as ids of 512-token blocks, equal ids marking shared prefixes
(block 0 is the system prompt every request shares). Each id becomes 512
token ids of its own, so that vLLM's prefix cache on the simulated engines
(bench/scale/scale_fleet.py) shares exactly what the trace shares. Block 1 names
the conversation (routing/sim/trace.py `conversation_session`): it is the
request's `x-session-affinity`; a conversation's first request is its
turn 1. Arrivals are the trace's, `speed` times faster; prompts longer than
the engines' context are left out (counted), and outputs are capped at
`max_output` tokens (decode steps are most of the bench's wall time, and
routing decides on prompts). The oracle is one unbounded cache that holds
every earlier request's prompt from its arrival. Everything else is bench/scale/scale_agentic.py's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from bench.scale.scale_agentic import MAX_MODEL_LEN, VOCAB, Run
from common.constants import TRACE, TRACE_BLOCK_TOKENS


@dataclass
class TraceShape:
    """Which part of the trace, how fast, and the fields Run reads of a Shape."""

    speed: float = 20.0  # trace seconds per virtual second
    limit: int = 4000  # trace requests replayed, from the start
    max_output: int = 128
    measure_from: float = 0.3
    duration_s: float = 0.0  # set from the replayed requests' last arrival
    seed: int = 0
    tenants: int = 1
    system_tokens: int = 0
    skipped: int = 0  # requests longer than the engines' context

    def __post_init__(self) -> None:
        self.rows()  # sets duration_s and skipped, which Run and the report read before arrivals

    def rows(self) -> list[dict]:
        """The replayed requests, and this shape's duration and skipped count set from them."""
        out, self.skipped = [], 0
        with open(TRACE, encoding="utf-8") as f:
            for line in f:
                if len(out) + self.skipped >= self.limit:
                    break
                row = json.loads(line)
                if row["input_length"] + self.max_output > MAX_MODEL_LEN:
                    self.skipped += 1
                    continue
                out.append(row)
        self.duration_s = out[-1]["timestamp"] / 1000 / self.speed if out else 0.0
        return out


def block_tokens(block_id: int) -> list[int]:
    """The 512 token ids that stand for one trace block: its own, the same at every use."""
    lo, span = VOCAB[0], VOCAB[1] - VOCAB[0]
    return [lo + hash((block_id, j)) % span for j in range(TRACE_BLOCK_TOKENS)]


class TraceRun(Run):
    """The trace's requests, routed by one policy (Run's callbacks for Fleet.run)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.turns: dict[str, int] = {}  # requests seen per conversation

    def arrivals(self) -> list[tuple[float, object]]:
        return [(row["timestamp"] / 1000 / self.shape.speed, row) for row in self.shape.rows()]

    def on_arrival(self, row: dict, now: float, fleet) -> tuple:
        ids, n = row["hash_ids"], row["input_length"]
        prompt = [t for b in ids for t in block_tokens(b)][:n]
        sid = f"c{ids[1]}" if len(ids) > 1 else None
        turn = 1
        if sid:  # one-block prompts name no conversation: each is a turn 1
            turn = self.turns[sid] = self.turns.get(sid, 0) + 1
        self.live[id(row)] = row
        self.peak_live = max(self.peak_live, len(self.live))
        out = max(1, min(row["output_length"], self.shape.max_output))
        sent = self.send(row, sid, turn, prompt, "t0", out, now, fleet)
        self.oracle.update(self.reqs[sent[1]]["hashes"])  # the oracle has computed every earlier prompt
        return sent

    def finished(self, r: dict, now: float) -> list:
        """A trace request has no next turn."""
        r.pop("hashes")
        self.live.pop(id(r["session"]), None)
        return []
