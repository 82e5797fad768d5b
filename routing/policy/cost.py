"""What a request will cost on one candidate replica, in seconds.

Every routing choice (keep a session's pin, move it, place a prompt by its
cached prefix) compares candidates by one number: the time until this
request's prompt is computed there.

    queue   the prefill work already ahead of it on that engine (blocks
            in flight that are not yet computed, at its measured prefill
            rate), or how long the engine's oldest unscheduled request has
            waited, whichever is longer: a scheduler that is not admitting
            work (KV full, batch budget spent) queues whatever the counts say;
    prefill the blocks of the prompt it neither holds nor can load, at its
            measured prefill rate;
    load    the blocks the shared tier (the Mooncake pool) holds beyond what
            it holds itself, at its measured load rate;
    evict   what the blocks it must store do to the sessions already there:
            whatever does not fit in its empty KV blocks evicts cached blocks,
            which the sessions they belong to compute again on their next
            turn (or load again, where a shared tier holds the prompt).

The first three are this request's own wait (`Cost.ttft_s`, what a move is
measured against). A block computed is also work that every request which
arrives behind it on that engine waits for: on a busy pool, recompute
compounds (a moved turn's recompute queues the next turns, which then look
cheaper elsewhere, and so on). So the choosing cost (`Cost.total`) prices
computed and evicted blocks at `recompute_weight` times the prefill rate,
the others' share being `Cost.others_s`. The trace simulator sets the
weight (docs/router_benchmark.md): at 1, pure own time, the hit ratio
loses 10-17 points to moves that feed each other; at 4, the M/G/1
externality at 75% busy, 2-5; at 32 the conversation-trace targets hold.

Dynamo's KV router scores `overlap weight × new prefill blocks + active
blocks`; this is the same shape with both terms in seconds from measured
rates, plus the evictions a move forces, so a pin's move is one more
comparison of the same cost (routing/policy/policy.py), not a separate count rule.

Pure logic: the caller passes loads, rates and the index's match.
"""

from __future__ import annotations

from dataclasses import dataclass

from routing.policy.contracts import ReplicaLoad


@dataclass(frozen=True)
class Rates:
    """Seconds per block computed, and per block loaded from the shared tier."""

    prefill_s_per_block: float
    load_s_per_block: float = 0.0

    def __post_init__(self) -> None:
        if self.prefill_s_per_block <= 0 or self.load_s_per_block < 0:
            raise ValueError("prefill_s_per_block must be > 0 and load_s_per_block >= 0")


@dataclass(slots=True)
class Cost:
    """One candidate's predicted cost for one request, by part (seconds). Not frozen: the policy
    prices every candidate per decision, and a frozen __init__ is three times a slotted one's."""

    queue_s: float
    prefill_s: float
    load_s: float
    others_s: float  # what its computed and evicted blocks cost the requests behind them
    computed_blocks: int
    loaded_blocks: int
    evicted_blocks: int

    @property
    def ttft_s(self) -> float:
        """This request's own predicted wait until its prompt is computed."""
        return self.queue_s + self.prefill_s + self.load_s

    @property
    def total(self) -> float:
        """What the policy compares: its own wait plus what it costs others."""
        return self.ttft_s + self.others_s


def rates_of(load: ReplicaLoad, default: Rates, seen: dict | None = None) -> Rates:
    """The replica's own measured rates where it reports them, else ``default``'s. ``seen``: Rates
    already made in this decision, by their two figures (a pool's replicas mostly share them);
    changes ``seen`` only."""
    key = (load.prefill_s_per_block, load.load_s_per_block)
    rates = seen.get(key) if seen is not None else None
    if rates is None:
        rates = Rates(key[0] if key[0] > 0 else default.prefill_s_per_block,
                      key[1] if key[1] > 0 else default.load_s_per_block)
        if seen is not None:
            seen[key] = rates
    return rates


def queued_blocks(load: ReplicaLoad) -> float:
    """Prefill work ahead on the replica, in blocks: its reported queue, else its work in flight."""
    return load.queued_prefill_blocks if load.queued_prefill_blocks is not None else load.pending_blocks


def price(n_blocks: int, held: int, credited: int, tier_held: int, load: ReplicaLoad, rates: Rates,
          recompute_weight: float = 1.0) -> Cost:
    """The cost of a prompt of ``n_blocks`` blocks on one candidate.

    ``held``: the leading blocks the candidate holds; ``credited``: leading
    blocks treated as held anyway (a shared head every candidate has or gets
    cheaply, routing/policy/policy.py step 3); ``tier_held``: the leading blocks the
    shared tier holds (0 without one). Changes nothing.
    """
    start = min(n_blocks, max(held, credited))
    loaded = max(0, min(tier_held, n_blocks) - start)
    computed = n_blocks - start - loaded
    empty = max(0, load.free_kv_blocks)
    evicted = max(0, computed + loaded - empty)
    queue_s = max(queued_blocks(load) * rates.prefill_s_per_block, load.oldest_wait_s)
    p = rates.prefill_s_per_block
    restore = rates.load_s_per_block if tier_held > 0 else recompute_weight * p
    others = (recompute_weight - 1.0) * computed * p + evicted * restore
    return Cost(queue_s, computed * p, loaded * rates.load_s_per_block, others, computed, loaded, evicted)


def worth_moving(stay: Cost, move: Cost, margin: float, margin_s: float) -> bool:
    """Whether a pinned session should leave for the candidate costing ``move``:
    only when moving saves more than ``margin`` of the wait staying would cost
    (``stay.ttft_s``) plus ``margin_s`` seconds, so that two nearly equal
    costs never flap a pin. The margin is taken of the wait, not of the
    totals: their share for the requests behind is often the same on both
    sides (the same new blocks computed) and would swamp a relative margin.

    And only when the move shortens this request's own wait: a pin moves to
    escape the queue or the recompute ahead of it, never for the others'
    share alone. Staying's others' share is mostly the engine's LRU victims
    for the turn's few new blocks, which on an engine whose KV has filled
    with old work are as likely dead as a live session's; moving for them
    would trade a whole context's load or recompute for one block (seen in
    CI: a decode-only turn 2 left its replica, full of earlier tests' cache,
    for an emptier one)."""
    return move.ttft_s < stay.ttft_s and stay.total - move.total > margin * stay.ttft_s + margin_s
