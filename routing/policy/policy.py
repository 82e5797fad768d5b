# Baton routing policy
# ====================
#
# Goal: send each request to the replica that will compute the fewest blocks
# for it, without letting any replica's load run away, and keep a
# conversation on one replica so its KV is found again next turn.
#
# Inputs per decision (all passed in, nothing global):
#   - the request's chained block hashes, optional session id;
#   - per-candidate ReplicaLoad (work in flight, KV free/capacity, alive);
#   - the exact PrefixIndex (fed by engine KV events) and the SessionPins;
#   - ``now`` and a seeded RNG.
#
# Algorithm (O(prompt blocks + replicas)):
#   1. Candidates = live replicas. load(r) = work in flight in blocks
#      (``pending_blocks``; running + queued when no replica reports it).
#      A candidate is *overloaded* when
#        load(r) > OVERLOAD_RATIO * mean(load of the others) + slack,
#      slack = OVERLOAD_SLACK_BLOCKS, or OVERLOAD_SLACK_REQUESTS when the
#      loads are request counts (engines' reports). The others' mean, not the
#      pool's: with 2 replicas, 2x the pool's mean can never be exceeded.
#      A candidate is overloaded too when its engine's oldest unscheduled
#      request has waited OVERLOAD_WAIT_S longer than the least-waiting
#      other candidate's: its scheduler is not admitting work (KV full,
#      batch budget spent), whatever the counts say. The bound is checked
#      per candidate: an overloaded replica is skipped, everyone else keeps
#      their affinity. There is no fleet-wide "affinity off" switch, which is
#      what sent upstream routers into hot spots and death spirals.
#   2. Session pin: if the session is pinned to a live replica, price staying
#      and every other candidate under the bound with one cost in seconds
#      (routing/policy/cost.py: queue ahead + blocks to compute + blocks to load from
#      the shared tier + the evictions the stored blocks force, at each
#      engine's measured rates). The pin moves ("moved", re-pinned) only
#      when a candidate is cheaper than staying by MOVE_MARGIN and
#      MOVE_MARGIN_BLOCKS of prefill and the move shortens the request's own
#      wait (never for the others' share alone); otherwise it stays ("pinned"), even on
#      a replica over the bound: the bound sheds new work, and a pinned turn
#      moved off it pays its whole context elsewhere, plus the evictions
#      there, which the cost weighs against the queue it escapes.
#   3. Prefix match in the index: held(r) = leading blocks r holds. Then the
#      *shared head* of the prompt: popular = the longer of
#        - the leading run held by at least POPULAR_FRACTION (and at least
#          two) of the non-overloaded candidates, and
#        - that run extended up to a block with a fan-out of at least
#          SHARED_FANOUT in the index, reached from the run's last block (or
#          the prompt's first) through blocks with one child each (many
#          conversations continue it: a system prompt or template; the
#          trace's hash id 0 has 7,373; prefix_index.shared_head).
#      The shared head tells candidates apart by nothing and is cheap to
#      replicate, so every candidate is credited with it. Without this credit
#      the first replica to hold the system prompt wins every new
#      conversation and new replicas never warm up.
#   4. If some non-overloaded candidate holds more than the popular run (a
#      conversation-specific prefix): the cheapest by the same cost, the
#      popular run credited to every candidate; ties to the less loaded
#      ("prefix" when it holds more than the popular run, else "load").
#   5. Cold request (nothing specific cached anywhere): power of two choices
#      among non-overloaded candidates by load ("load"). A cold replica (KV
#      more than COLD_FREE_FRACTION free, e.g. newly added) joins the draw as
#      a third choice, so it is filled with new conversations instead of
#      staying empty. New conversations are what balances the pool: they
#      carry no cache, so placing them costs nothing.
#      A new session whose caller passes a ``placement`` ticket goes instead
#      to the candidate with the fewest live sessions pinned
#      (ReplicaLoad.sessions); among those, the least loaded in flight; ties
#      taken in turn by ticket. Load in flight is the wrong first signal: a
#      session's context stays in its replica's cache for every later turn,
#      while in a closed loop its next turn arrives just as its last one
#      freed a slot, so in-flight counts look even while one replica collects
#      more contexts than its cache holds. Among equal session counts it is
#      the right one: the sessions a client has in flight together keep
#      arriving together (a closed loop sends its turns round in a fixed
#      order), so a session placed beside two busy ones queues behind them
#      every turn while the other replica idles (bench affinity colocated:
#      3 of 4 requests in flight on one replica for a whole run, its cached
#      turns twice as slow as in a run that placed them evenly).
#      The ticket comes from a counter every front shares, so fronts that
#      place a burst of sessions at once (all reading the same counts)
#      still take turns instead of piling onto one replica.
#   6. Pin the session (if any) to the choice; a moved pin is a re-pin.
#
# Thresholds (PolicyConfig), chosen from the trace sweep in
# docs/router_benchmark.md and the bench affinity runs in docs/benchmarks.md:
#   MOVE_MARGIN = 0.25, MOVE_MARGIN_BLOCKS = 2: a pin moves when moving
#     saves more than a quarter of the wait staying would cost, plus two
#     blocks of prefill. Costs are predictions from rates a few seconds old;
#     a margin keeps a pin from flapping between two nearly equal replicas.
#   DEFAULT_RATES: seconds per block computed and loaded for a replica that
#     has not reported its own (the simulator's 10 blocks/s; a real engine
#     reports its fit after its first steps, actors/vllm_plugin.py).
#   OVERLOAD_RATIO = 2.0, OVERLOAD_SLACK_BLOCKS = 200: the per-candidate hard
#     bound, 2x the mean load plus 20 s of prefill work. Above it a replica
#     takes no new sessions and no prefix traffic until it drains; its
#     pinned sessions stay unless the cost says to move. Tighter bounds
#     (1.3x + 30) break affinity on ordinary bursts and cost 4-8 points.
#   OVERLOAD_SLACK_REQUESTS = 4, when loads are request counts (the real
#     stack): an engine batches what it holds, so 3 requests against 0 is
#     no runaway.
#   OVERLOAD_WAIT_S = 5: a queue 5 s longer than a peer's is a scheduler not
#     admitting work; well past the engines' load reports' age.
#   POPULAR_FRACTION = 0.5: a prefix held by half the candidates is popular.
#   SHARED_FANOUT = 8: a block continued 8 different ways is a shared head.
#     On the trace only ~20 blocks reach it; conversation blocks have 1-2
#     children (a turn that branched). 2, 4, 8 and 16 are within 1 point.
#   COLD_FREE_FRACTION = 0.5: a replica with more than half its KV free is cold.
#   Session pins use the pins' TTL (SessionPins.ttl_s, default 600 s).

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from routing.policy.contracts import ReplicaLoad, RoutingDecision, RoutingRequest, loads_in_blocks, scalar_loads
from routing.policy.cost import Cost, Rates, price, rates_of, worth_moving
from routing.prefix.prefix_index import PrefixIndex
from routing.prefix.session_pins import SessionPins


@dataclass(frozen=True)
class PolicyConfig:
    """Thresholds of the Baton policy; see the comment at the top of policy.py."""

    recompute_weight: float = 32.0
    move_margin: float = 0.25
    move_margin_blocks: float = 2.0
    default_rates: Rates = Rates(prefill_s_per_block=0.1, load_s_per_block=0.005)
    overload_ratio: float = 2.0
    overload_slack_blocks: float = 200.0
    overload_slack_requests: float = 4.0  # when loads are request counts (no pending_blocks)
    overload_wait_s: float = 5.0
    cold_free_fraction: float = 0.5
    popular_fraction: float = 0.5
    shared_fanout: int = 8
    shared_tier: str | None = None  # the index's holder name for a pool every candidate loads from

    def __post_init__(self) -> None:
        if self.recompute_weight < 1.0:
            raise ValueError("recompute_weight must be >= 1")
        if self.move_margin < 0 or self.move_margin_blocks < 0:
            raise ValueError("move margins must be >= 0")
        if self.overload_ratio < 1.0:
            raise ValueError("overload_ratio must be >= 1")
        if self.overload_slack_blocks < 0 or self.overload_slack_requests < 0 or self.overload_wait_s < 0:
            raise ValueError("overload slacks must be >= 0")
        if self.shared_fanout < 2:
            raise ValueError("shared_fanout must be >= 2")
        if not 0.0 < self.popular_fraction <= 1.0:
            raise ValueError("popular_fraction must be in (0, 1]")
        if not 0.0 <= self.cold_free_fraction <= 1.0:
            raise ValueError("cold_free_fraction must be in [0, 1]")


class BatonPolicy:
    """The Baton routing policy. Holds only its config and RNG."""

    prune = True  # False prices every candidate of a pinned turn: the reference the tests compare with

    def __init__(self, config: PolicyConfig | None = None, rng: random.Random | None = None) -> None:
        self.config = config or PolicyConfig()
        self.rng = rng or random.Random(0)

    def route(self, request: RoutingRequest, loads: dict[str, ReplicaLoad], index: PrefixIndex,
              pins: SessionPins, now: float, placement: int | None = None,
              match: dict[str, int] | None = None) -> RoutingDecision:
        """Choose a replica among ``loads`` for ``request``.

        ``placement``: a ticket for placing a session that has no live pin by
        its candidates' ``sessions`` (step 5); None keeps the load draw.
        ``match``: ``index.match(request.block_hashes)`` where the caller has it already.
        Changes: ``pins`` (the request's session is pinned or re-pinned to the choice, TTL
        refreshed) and the RNG state. Reads ``index``. Raises ValueError when no candidate is alive.
        """
        cfg = self.config
        load = scalar_loads(loads)
        if not load:
            raise ValueError("no live replica to route to")
        names = list(load)
        bound = self._under_bound(load, loads)  # once: per candidate it made a decision O(replicas^2)
        ok = [n for n in names if n in bound] or names
        match = index.match(request.block_hashes) if match is None else match
        held = {n: match.get(n, 0) for n in names}
        popular = self._popular_len([held[n] for n in ok])
        # The walk starts at the popular run's last block: the blocks before it are shared anyway, and
        # reading their fan-outs (cold in memory after the match) was a tenth of a decision at 64 replicas.
        popular = max(popular, index.shared_prefix_len(request.block_hashes, cfg.shared_fanout, max(0, popular - 1)))
        tier = match.get(cfg.shared_tier, 0) if cfg.shared_tier is not None else 0

        seen: dict = {}

        def cost(n: str) -> Cost:
            return price(request.n_blocks, held[n], popular, tier, loads[n],
                         rates_of(loads[n], cfg.default_rates, seen), cfg.recompute_weight)

        if request.session is not None:
            pinned = pins.get(request.session, now)
            if pinned in load:
                floors = self._floors(ok, loads, held, popular, request.n_blocks, tier > 0) if self.prune else None
                choice, stay, moved = self._keep_or_move(pinned, ok, cost, load, loads[pinned], floors)
                if choice == pinned:
                    return RoutingDecision(pinned, "pinned", held[pinned], False, stay.ttft_s, stay.ttft_s)
                return RoutingDecision(choice, "moved", held[choice], pins.pin(request.session, choice, now),
                                       moved.ttft_s, stay.ttft_s)

        best_specific = max(held[n] for n in ok) - popular
        predicted = None
        if best_specific > 0:
            costs = {n: cost(n) for n in ok}
            choice = min(ok, key=lambda n: (costs[n].total, load[n]))
            reason = "prefix" if held[choice] > popular else "load"
            predicted = costs[choice].ttft_s
        else:
            choice = self._cold_choice(ok, load, loads, placement if request.session is not None else None)
            reason = "load"

        repinned = False
        if request.session is not None:
            repinned = pins.pin(request.session, choice, now)
        return RoutingDecision(choice, reason, held[choice], repinned, predicted)

    def _keep_or_move(self, pinned: str, ok: list[str], cost, load: dict[str, float],
                      pinned_load: ReplicaLoad, floors: dict[str, float] | None) -> tuple[str, Cost, Cost]:
        """Step 2: the pinned replica, or the cheapest other candidate under the bound where
        moving beats staying by the margins; with the cost of staying and of the choice.

        Moving needs a total under `bar` (worth_moving), so only the candidates whose `floors` (a
        lower bound of their total; None prices all) are under it are priced: where one of the others is worth
        moving to, the cheapest of all is among them, and where none is, the pin stays either way.
        At 64 replicas a pinned turn priced 63 candidates that held none of its context."""
        cfg = self.config
        stay = cost(pinned)
        margin_s = cfg.move_margin_blocks * rates_of(pinned_load, cfg.default_rates).prefill_s_per_block
        bar = stay.total - cfg.move_margin * stay.ttft_s - margin_s
        others = [n for n in ok if n != pinned and (floors is None or floors[n] * (1 - 1e-9) < bar)]  # rounding
        if not others:
            return pinned, stay, stay
        costs = {n: cost(n) for n in others}
        alt = min(others, key=lambda n: (costs[n].total, load[n]))
        if worth_moving(stay, costs[alt], cfg.move_margin, margin_s):
            return alt, stay, costs[alt]
        return pinned, stay, stay

    def _floors(self, ok: list[str], loads: dict[str, ReplicaLoad], held: dict[str, int], popular: int,
                n_blocks: int, tiered: bool) -> dict[str, float]:
        """A lower bound of each candidate's `cost(n).total` (see _keep_or_move): its wait, and
        the blocks it lacks at the least any block can cost. The second term is the same for
        every candidate holding no more than the popular head, most of them: one comprehension,
        no call per candidate. Changes nothing."""
        per_block = self._block_floor(loads, tiered)
        head = (n_blocks - min(n_blocks, popular)) * per_block
        return {n: loads[n].oldest_wait_s + (head if held[n] <= popular else
                                             (n_blocks - min(n_blocks, held[n])) * per_block) for n in ok}

    def _block_floor(self, loads: dict[str, ReplicaLoad], tiered: bool) -> float:
        """The least any candidate's total can grow per prompt block it lacks: a block computed
        costs `recompute_weight` x its seconds (its own time and the requests' behind it), one
        loaded from the shared tier (where it holds the prompt) its load time. Changes nothing."""
        d, w, least = self.config.default_rates, self.config.recompute_weight, math.inf
        for p, lr in {(l.prefill_s_per_block, l.load_s_per_block) for l in loads.values()}:
            block = w * (p if p > 0 else d.prefill_s_per_block)  # an unreported figure is the default's (rates_of)
            least = min(least, min(block, lr if lr > 0 else d.load_s_per_block) if tiered else block)
        return least

    def _under_bound(self, load: dict[str, float], loads: dict[str, ReplicaLoad]) -> set[str]:
        """The candidates within the overload bound (step 1): load against the others' mean (with
        2 replicas, 2x the pool's mean never binds) and queue wait against the least-waiting other."""
        cfg = self.config
        if len(load) == 1:
            return set(load)
        slack = cfg.overload_slack_blocks if loads_in_blocks(loads) else cfg.overload_slack_requests
        total, others_n = sum(load.values()), len(load) - 1
        names, waits = list(load), [loads[n].oldest_wait_s for n in load]
        # The least wait among the others: the pool's least, or for its (first) holder the second least.
        least, second = sorted(waits)[:2]
        first = names[waits.index(least)]
        ratio, wait_s = cfg.overload_ratio, cfg.overload_wait_s
        return {n for n, own, wait in zip(names, load.values(), waits)
                if own <= ratio * ((total - own) / others_n) + slack
                and wait <= (second if n == first else least) + wait_s}

    def _popular_len(self, held: list[int]) -> int:
        """Leading blocks held by at least POPULAR_FRACTION of ``held``'s
        candidates, and by two of them at least (one holder is not popular)."""
        k = min(len(held), max(2, math.ceil(self.config.popular_fraction * len(held))))
        return sorted(held, reverse=True)[k - 1]

    def _cold_choice(self, ok: list[str], load: dict[str, float], loads: dict[str, ReplicaLoad],
                     placement: int | None = None) -> str:
        if len(ok) == 1:
            return ok[0]
        if placement is not None:  # a new session: fewest sessions, then least in flight, ties in turn (step 5)
            best = min((loads[n].sessions, load[n]) for n in ok)
            tied = sorted(n for n in ok if (loads[n].sessions, load[n]) == best)
            return tied[placement % len(tied)]
        draw = self.rng.sample(ok, 2)
        cold = [n for n in ok if loads[n].free_kv_blocks > self.config.cold_free_fraction * loads[n].capacity]
        if cold:
            draw.append(self.rng.choice(cold))
        return min(draw, key=lambda n: load[n])
