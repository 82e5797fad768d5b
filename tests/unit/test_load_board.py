"""The front's per-pool load board (deployments/front/load_board.py): kept between decisions,
equal at every decision to the loads built from scratch."""

from __future__ import annotations

import random

from deployments.front.load_board import LoadBoard, Tally, replica_wait

NAMES = [f"r{i}" for i in range(6)]


def _view(rng: random.Random, now: float) -> tuple[dict, dict, dict, dict]:
    """A fresh read of the shared view: (live entries, base, others' in flight, others' queued)."""
    live = {n: {"ts": now - rng.uniform(0, 2), "waiting": rng.random() < 0.4,
                "oldest_wait_s": rng.choice([0.0, 0.3])} for n in NAMES if rng.random() < 0.9}
    base = {n: (100, rng.randint(0, 100), 0.01, 0.001) for n in live}
    theirs = {n: rng.randint(0, 3) for n in live if rng.random() < 0.5}
    seen = {n: rng.uniform(0, 9) for n in live if rng.random() < 0.5}
    return live, base, theirs, seen


def test_the_board_equals_loads_built_from_scratch_through_any_sequence_of_changes():
    rng = random.Random(3)
    mine, queued = Tally(), Tally()
    board, now, placed = LoadBoard(mine, queued), 100.0, {}
    view = _view(rng, now)
    for step in range(3000):
        now += rng.uniform(0, 0.05)
        roll = rng.random()
        if roll < 0.05:
            view = _view(rng, now)
        elif roll < 0.5:  # a request starts, ends, or its prompt was computed
            n = rng.choice(NAMES)
            mine[n] += rng.choice([1, -1]) if mine[n] > 0 else 1
            if rng.random() < 0.5:
                queued[n] += rng.uniform(-1, 4)
        live, base, theirs, seen = view
        sessions = {n: rng.randint(0, 4) for n in live} if rng.random() < 0.3 else {}
        placed = sessions or placed
        got = board.update(live, sorted(live), base, theirs, seen, sessions, now)
        fresh = LoadBoard(mine, queued).update(live, sorted(live), base, theirs, seen,
                                               {n: placed.get(n, 0) for n in live}, now)
        assert list(got) == sorted(live) and got == fresh, step


def test_a_replica_with_a_request_waiting_ages_with_the_clock_and_nothing_else_is_rebuilt():
    mine, queued = Tally(), Tally()
    board = LoadBoard(mine, queued)
    live = {"a": {"ts": 10.0, "waiting": True, "oldest_wait_s": 0.5}, "b": {"ts": 10.0}}
    base = {n: (100, 50, 0.01, 0.001) for n in live}
    theirs, seen, no_sessions = {"a": 2}, {}, {}
    first = dict(board.update(live, ["a", "b"], base, theirs, seen, no_sessions, 11.0))
    assert first["a"].oldest_wait_s == replica_wait(live["a"], 11.0) == 1.5 and first["b"].oldest_wait_s == 0.0
    later = board.update(live, ["a", "b"], base, theirs, seen, no_sessions, 12.0)
    assert later["a"].oldest_wait_s == 2.5 and later["b"] is first["b"]  # b's load object kept
    mine["b"] += 1
    assert board.update(live, ["a", "b"], base, theirs, seen, no_sessions, 12.0)["b"].running == 1
    assert not mine.touched  # the board took this front's changes
