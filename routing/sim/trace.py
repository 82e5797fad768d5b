"""Loading the Mooncake conversation trace.

Each line is ``{"timestamp": ms, "input_length", "output_length",
"hash_ids": [...]}`` with 512 tokens per hash block; equal ids at equal
positions mark shareable prefix blocks. The ids are turned into chained block
hashes with the same ``hash_blocks`` the router uses (one id = one "token" of
a one-token block), so the simulator exercises the real hashing path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from common.constants import TRACE_BLOCK_TOKENS
from routing.prefix.block_hash import hash_blocks


@dataclass(frozen=True)
class TraceRequest:
    """One request of the trace, times in seconds."""

    arrival_s: float
    input_length: int
    output_length: int
    block_hashes: tuple[int, ...]


def load_trace(path: str | Path, limit: int | None = None, salt: str | None = None) -> list[TraceRequest]:
    """Read up to ``limit`` requests from ``path``, sorted by arrival."""
    out: list[TraceRequest] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if limit is not None and len(out) >= limit:
                break
            line = line.strip()
            if not line:
                continue
            row = json.loads(line)
            hashes = hash_blocks(row["hash_ids"], block_size=1, salt=salt)
            out.append(
                TraceRequest(
                    arrival_s=row["timestamp"] / 1000.0,
                    input_length=int(row["input_length"]),
                    output_length=int(row["output_length"]),
                    block_hashes=tuple(hashes),
                )
            )
    out.sort(key=lambda r: r.arrival_s)
    return out


def conversation_session(request: TraceRequest) -> str | None:
    """A session id for trace replays that want ``x-session-affinity``.

    The trace carries no session ids. Block 0 is the system prompt shared by
    every request; block 1 is the first block specific to a conversation, so
    its hash stands in for the conversation id. None for one-block prompts.
    """
    if len(request.block_hashes) < 2:
        return None
    return f"{request.block_hashes[1]:016x}"
