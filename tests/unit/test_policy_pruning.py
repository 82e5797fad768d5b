"""A pinned turn prices only the candidates that could be worth moving to (BatonPolicy.prune):
its decisions are the same as pricing every candidate, over random pools, indexes and loads."""

from __future__ import annotations

import random

import pytest

from routing.policy.contracts import ReplicaLoad, RoutingRequest
from routing.policy.policy import BatonPolicy, PolicyConfig
from routing.prefix.prefix_index import PrefixIndex
from routing.prefix.session_pins import SessionPins

TIER = "store"


def _scenario(rng: random.Random):
    n = rng.randint(2, 12)
    names = [f"r{i}" for i in range(n)]
    prompt = [1000 + i for i in range(rng.randint(1, 60))]
    idx = PrefixIndex()
    shared = rng.randint(0, len(prompt))
    for name in names:  # a shared head most hold, then each its own share of the prompt
        held = shared if rng.random() < 0.7 else 0
        held = max(held, rng.choice([0, 0, rng.randint(0, len(prompt))]))
        if held:
            idx.apply_stored(name, prompt[:held])
    if rng.random() < 0.5:
        idx.apply_stored(TIER, prompt[:rng.randint(1, len(prompt))])
    loads = {name: ReplicaLoad(running=rng.randint(0, 6), queued=rng.choice([0, 0, 2]),
                               free_kv_blocks=rng.choice([0, 5, 50, 500]), capacity=500,
                               pending_blocks=rng.choice([0.0, 0.0, rng.uniform(0, 400)]),
                               oldest_wait_s=rng.choice([0.0, 0.0, rng.uniform(0, 3)]),
                               queued_prefill_blocks=rng.choice([None, rng.uniform(0, 200)]),
                               prefill_s_per_block=rng.choice([0.0, 0.002, 0.01]),
                               load_s_per_block=rng.choice([0.0, 0.0005, 0.02]))
             for name in names}
    return names, prompt, idx, loads


@pytest.mark.parametrize("seed", range(8))
def test_pruned_pinned_turns_decide_as_pricing_every_candidate(seed):
    rng = random.Random(seed)
    moved = kept = 0
    for _ in range(250):
        names, prompt, idx, loads = _scenario(rng)
        pinned, tiered = rng.choice(names), rng.random() < 0.5
        decisions = []
        for prune in (True, False):
            policy = BatonPolicy(PolicyConfig(shared_tier=TIER if tiered else None), rng=random.Random(seed))
            policy.prune = prune
            pins = SessionPins(ttl_s=60)
            pins.pin("s", pinned, 0.0)
            d = policy.route(RoutingRequest(tuple(prompt), "s"), loads, idx, pins, now=1.0)
            decisions.append((d, pins.get("s", 1.0)))
        assert decisions[0] == decisions[1]
        moved += decisions[0][0].reason == "moved"
        kept += decisions[0][0].reason == "pinned"
    assert moved > 10 and kept > 10, (moved, kept)  # both outcomes were compared


def _bound_by_definition(cfg: PolicyConfig, loads: dict[str, ReplicaLoad]) -> set[str]:
    """Step 1 candidate by candidate: load against the others' mean, wait against the least other's."""
    live = {n: l for n, l in loads.items() if l.alive}
    blocks = any(l.pending_blocks > 0 for l in live.values())
    load = {n: (l.pending_blocks if blocks else float(l.running + l.queued)) for n, l in live.items()}
    if len(load) == 1:
        return set(load)
    slack = cfg.overload_slack_blocks if blocks else cfg.overload_slack_requests
    out = set()
    for n, own in load.items():
        others = [m for m in load if m != n]
        mean = sum(load[m] for m in others) / len(others)
        least_other = min(live[m].oldest_wait_s for m in others)
        if own <= cfg.overload_ratio * mean + slack and live[n].oldest_wait_s <= least_other + cfg.overload_wait_s:
            out.add(n)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_the_overload_bound_is_each_candidates_own_test(seed):
    """The bound (each load against (total - own) / others, each wait against the least or, for
    the least-waiting, the second least) is the definition's set, over random loads, waits and
    dead replicas, where some candidates are over it and where none is."""
    from routing.policy.contracts import scalar_loads
    rng = random.Random(seed)
    over = 0
    for _ in range(500):
        _, _, _, loads = _scenario(rng)
        for name in loads:
            if rng.random() < 0.1:
                loads[name].alive = False
            if rng.random() < 0.15:
                loads[name].oldest_wait_s = rng.uniform(0, 12)
                loads[name].running = rng.choice([loads[name].running, 40])
        if not any(l.alive for l in loads.values()):
            continue
        cfg = PolicyConfig(overload_slack_requests=rng.choice([0.0, 4.0]), overload_wait_s=rng.choice([0.0, 5.0]))
        got = BatonPolicy(cfg)._under_bound(scalar_loads(loads), loads)
        assert got == _bound_by_definition(cfg, loads)
        over += len(got) < sum(l.alive for l in loads.values())
    assert over > 50, over  # candidates over the bound were compared, not only pools within it
