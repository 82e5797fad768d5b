"""The routing cost in seconds (routing/policy/cost.py), the engines' fitted rates (routing/policy/rates.py)
and the pin decisions the policy makes with them. Pure: time and loads passed in."""

from __future__ import annotations

import random

import pytest

from routing.policy.contracts import ReplicaLoad, RoutingRequest
from routing.policy.cost import Rates, price, worth_moving
from routing.policy.policy import BatonPolicy, PolicyConfig
from routing.prefix.prefix_index import PrefixIndex
from routing.policy.rates import StepFit
from routing.prefix.session_pins import SessionPins

BLOCK_S = 0.032  # a CPU engine's measured prefill: 2 ms a token, 16 tokens a block
CONTEXT = tuple(range(1, 76))  # a session's ~1.2k-token context: 75 blocks
TURN = CONTEXT + tuple(range(100, 119))  # its next turn adds 19 blocks


def _replica(queued: float, empty: int = 1000) -> ReplicaLoad:
    return ReplicaLoad(running=1, capacity=2000, free_kv_blocks=empty, queued_prefill_blocks=queued,
                       prefill_s_per_block=BLOCK_S)


def _route(a: ReplicaLoad, b: ReplicaLoad, index: PrefixIndex | None = None):
    """Routes TURN of session "s", pinned to `a`, which holds its context."""
    if index is None:
        index = PrefixIndex()
        index.apply_stored("a", list(CONTEXT))
    pins = SessionPins()
    pins.pin("s", "a", now=0)
    return BatonPolicy(rng=random.Random(0)).route(RoutingRequest(TURN, "s"), {"a": a, "b": b}, index, pins, now=1)


def test_a_pin_stays_when_moving_costs_a_whole_context_and_the_queue_ahead_is_short():
    # Two other turns (38 blocks) queued on a, none on b: staying waits 1.2 s, moving
    # recomputes 94 blocks (3 s) and more for the requests that then queue behind them.
    d = _route(_replica(queued=38), _replica(queued=0))
    assert (d.replica, d.reason, d.repinned) == ("a", "pinned", False)
    assert d.stay_s == pytest.approx((38 + 19) * BLOCK_S)


def test_a_pin_moves_when_the_queue_ahead_costs_more_than_the_recompute():
    # a's engine is stuck behind 5000 blocks (160 s); recomputing the whole context on b is cheaper.
    d = _route(_replica(queued=5000), _replica(queued=0))
    assert (d.replica, d.reason, d.repinned) == ("b", "moved", True)
    assert d.predicted_s == pytest.approx(94 * BLOCK_S) and d.stay_s == pytest.approx((5000 + 19) * BLOCK_S)
    assert d.predicted_s < d.stay_s


def test_a_pin_never_moves_for_the_others_share_alone():
    # As in CI: a short turn 2 (6 blocks held, 1 new) pinned to an idle `a` whose KV is full of
    # earlier tests' cache and whose fitted prefill rate came out 5x slower than idle `b`'s. Its
    # one new block evicts one cached block, priced at 32x a's rate for whoever owned it. The
    # totals favour computing all 7 blocks on `b`, but that makes this turn wait longer than its
    # one block on `a`: a move that saves the request nothing is not made.
    context, turn = (1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 5, 6, 7)
    index = PrefixIndex()
    index.apply_stored("a", list(context))
    full = ReplicaLoad(capacity=2000, free_kv_blocks=0, queued_prefill_blocks=0, prefill_s_per_block=5 * BLOCK_S)
    empty = ReplicaLoad(capacity=2000, free_kv_blocks=2000, queued_prefill_blocks=0, prefill_s_per_block=BLOCK_S)
    stay = price(7, 6, 0, 0, full, Rates(5 * BLOCK_S), 32)
    move = price(7, 0, 0, 0, empty, Rates(BLOCK_S), 32)
    assert stay.total - move.total > 0.25 * stay.ttft_s + 2 * 5 * BLOCK_S  # the totals alone would move it
    assert move.ttft_s > stay.ttft_s and not worth_moving(stay, move, margin=0.25, margin_s=2 * 5 * BLOCK_S)
    pins = SessionPins()
    pins.pin("s", "a", now=0)
    d = BatonPolicy(rng=random.Random(0)).route(RoutingRequest(turn, "s"), {"a": full, "b": empty}, index, pins, now=1)
    assert (d.replica, d.reason) == ("a", "pinned")


def test_a_move_that_evicts_other_sessions_prefixes_is_priced_with_them():
    rates = Rates(BLOCK_S)
    roomy = price(94, 0, 0, 0, _replica(queued=0, empty=1000), rates, recompute_weight=32)
    full = price(94, 0, 0, 0, _replica(queued=0, empty=10), rates, recompute_weight=32)
    assert (roomy.evicted_blocks, full.evicted_blocks) == (0, 84)
    assert full.ttft_s == roomy.ttft_s  # the moved turn itself waits no longer...
    assert full.total - roomy.total == pytest.approx(84 * 32 * BLOCK_S)  # ...the evicted sessions pay
    # A queue that a move to a roomy replica would escape is not escaped into a full one.
    queue = (94 * 32 * 2 + 19) * 1.0  # blocks queued on a: between the two destinations' costs
    assert _route(_replica(queued=queue), _replica(queued=0, empty=1000)).replica == "b"
    assert _route(_replica(queued=queue), _replica(queued=0, empty=10)).replica == "a"


def test_blocks_in_the_shared_tier_are_priced_as_loads_and_so_are_their_evictions():
    rates = Rates(BLOCK_S, load_s_per_block=0.001)
    c = price(94, 0, 0, 75, _replica(queued=0, empty=0), rates, recompute_weight=32)
    assert (c.computed_blocks, c.loaded_blocks, c.evicted_blocks) == (19, 75, 94)
    assert c.load_s == pytest.approx(0.075) and c.prefill_s == pytest.approx(19 * BLOCK_S)
    assert c.others_s == pytest.approx(31 * 19 * BLOCK_S + 94 * 0.001)


def test_a_scheduler_that_admits_nothing_queues_by_its_oldest_wait():
    stuck = ReplicaLoad(queued_prefill_blocks=0, oldest_wait_s=9.0)
    assert price(10, 10, 0, 0, stuck, Rates(BLOCK_S)).queue_s == 9.0


def test_the_margin_keeps_near_equal_costs_from_flapping():
    rates = Rates(BLOCK_S)
    stay = price(19, 0, 0, 0, _replica(queued=100), rates)
    close = price(19, 0, 0, 0, _replica(queued=85), rates)
    far = price(19, 0, 0, 0, _replica(queued=10), rates)
    assert not worth_moving(stay, close, margin=0.25, margin_s=2 * BLOCK_S)
    assert worth_moving(stay, far, margin=0.25, margin_s=2 * BLOCK_S)
    with pytest.raises(ValueError):
        PolicyConfig(recompute_weight=0.5)
    with pytest.raises(ValueError):
        Rates(0.0)


def test_the_step_fit_recovers_an_engines_rates_and_follows_a_change():
    rng = random.Random(1)
    fit = StepFit(half_life=50, warmup=0)
    assert fit.rates() is None

    def steps(n: int, compute: float, load: float) -> None:
        for _ in range(n):
            computed, loaded = rng.choice([8, 16, 256, 512, 1024]), rng.choice([0, 0, 0, 1024])
            fit.observe(0.004 + compute * computed + load * loaded + rng.uniform(-2e-4, 2e-4), computed, loaded)

    steps(400, compute=0.002, load=0.00005)
    r = fit.rates()
    assert r.compute_s_per_token == pytest.approx(0.002, rel=0.05)
    assert r.load_s_per_token == pytest.approx(0.00005, rel=0.2)
    assert r.base_s == pytest.approx(0.004, rel=0.2)
    steps(400, compute=0.0005, load=0.00005)  # a faster machine (or the other core freed)
    assert fit.rates().compute_s_per_token == pytest.approx(0.0005, rel=0.05)
    fit.observe(1.0, 0, 0)  # a step that did nothing teaches nothing
    assert fit.rates().steps == 800
    with pytest.raises(ValueError):
        fit.observe(-1.0, 1)


def test_the_step_fit_leaves_out_the_engines_warm_up_step():
    """The tiny model on CPU: the first step (14 prompt tokens) took 41.5 ms, the same step 2 ms
    the next time, decode steps 1.1 ms. Fitted, that one step priced a token at ~3 ms."""
    def fitted(warmup: int) -> float:
        fit = StepFit(warmup=warmup)
        fit.observe(0.0415, 14)
        for _ in range(39):
            fit.observe(0.0011, 1)
        fit.observe(0.002, 14)
        return fit.rates().compute_s_per_token

    assert fitted(warmup=0) > 1e-3
    assert fitted(warmup=1) < 1e-4


def test_a_pool_is_priced_at_its_engines_median_rate():
    from routing.policy.rates import median_rate

    beats = [{"prefill_s_per_token": 0.00031}, {"prefill_s_per_token": 0.00006}, {}, {"prefill_s_per_token": None}]
    assert median_rate(beats, "prefill_s_per_token") == pytest.approx((0.00031 + 0.00006) / 2)
    assert median_rate(beats + [{"prefill_s_per_token": 0.0001}], "prefill_s_per_token") == 0.0001
    assert median_rate([{}], "prefill_s_per_token") == 0.0
