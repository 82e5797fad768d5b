"""Sequence numbers of each engine's KV-event stream: gaps, restarts, replays.

vLLM's publisher numbers its batches 0, 1, 2, ... per engine process. The
indexer must apply every batch exactly once and in order, or the prefix
index drifts from what the engine holds. `SequenceTracker` tells, for each
batch that arrives, what to do first:

- `APPLY`: the next batch in order;
- `STALE`: one already applied (a replay overlapping the live stream): skip;
- `GAP`: batches `expected..seq-1` were lost (ZMQ drops under load, the
  indexer restarted): replay them from the engine's buffer, then apply;
- `RESTART`: the numbers went back to 0, a new engine process behind the
  same replica id: forget what the old one held, then apply.

A replica first seen at a number above 0 is a GAP from 0 (the indexer came
up after the engine). Pure logic: no ZMQ, no Redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Step(Enum):
    APPLY = "apply"
    STALE = "stale"
    GAP = "gap"
    RESTART = "restart"


@dataclass(frozen=True)
class Verdict:
    step: Step
    missing_from: int = 0  # GAP: the first lost batch (the last lost one is seq - 1)


class SequenceTracker:
    """The next expected batch number of every engine stream."""

    def __init__(self) -> None:
        self.expected: dict[str, int] = {}

    def observe(self, replica: str, seq: int) -> Verdict:
        """What to do with batch `seq` of `replica`; changes nothing (see `applied`)."""
        expected = self.expected.get(replica, 0)
        if seq == expected:
            return Verdict(Step.APPLY)
        if seq > expected:
            return Verdict(Step.GAP, expected)
        if seq == 0:
            return Verdict(Step.RESTART)
        return Verdict(Step.STALE)

    def applied(self, replica: str, seq: int) -> None:
        """Records that batch `seq` of `replica` is in the index; the next expected is seq + 1."""
        self.expected[replica] = seq + 1

    def forget(self, replica: str) -> None:
        """Drops `replica` (gone for good, or restarted): its next batch is expected from 0."""
        self.expected.pop(replica, None)


def replay_complete(start: int, end: int, got: list[int]) -> bool:
    """Whether a replay of batches `start..end-1` returned each of them (in any order, duplicates aside)."""
    return set(range(start, end)) <= set(got)
