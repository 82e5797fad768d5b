"""The shared routing state on a real Redis server: index slices, pins, registry."""

from __future__ import annotations

import asyncio
import random

import pytest
import redis
import redis.asyncio

from routing.policy.policy import BatonPolicy
from routing.prefix.prefix_index import PrefixIndex
from common.config import BatonConfig
from routing.prefix import redis_index, redis_state
from routing.prefix.redis_index import RedisIndex
from routing.prefix.redis_state import Registry
from routing.prefix.snapshot import pins_view


# These tests are about the state fronts share in Redis: their fronts read the index slice from Redis
# too (the front's own copy, routing.local_index, is tests/unit/test_index_feed.py's).
REDIS_READS = BatonConfig.model_validate({"routing": {"local_index": False}})


@pytest.fixture
def clients(redis_url):
    sync = redis.Redis.from_url(redis_url)
    sync.flushdb()
    return sync, redis_url


def run(url: str, fn):
    """Runs `fn(async_client)` in a fresh event loop with its own client; stops what the routing
    left running (its copy of the index follows the feed) before the client goes."""
    async def main():
        client = redis.asyncio.Redis.from_url(url)
        try:
            return await fn(client)
        finally:
            others = asyncio.all_tasks() - {asyncio.current_task()}
            for task in others:
                task.cancel()
            await asyncio.wait(others, timeout=5) if others else None
            await client.aclose()
    return asyncio.run(main())


async def snapshot(client, hashes):
    """One request's index slice, read the way the front reads it."""
    pipe = client.pipeline(transaction=False)
    redis_index.queue_snapshot(pipe, hashes)
    return redis_index.snapshot_from(hashes, await pipe.execute())


def test_snapshot_matches_the_in_memory_index(clients):
    sync, aio = clients
    writer, ref = RedisIndex(sync), PrefixIndex()
    for replica, hashes, parent in [("a", [1, 2, 3], None), ("b", [1, 2], None), ("b", [9], 2),
                                    ("c", [1, 5], None), ("a", [4], 3)]:
        writer.apply_stored(replica, hashes, parent)
        ref.apply_stored(replica, hashes, parent)
    writer.apply_removed("a", [2])
    ref.apply_removed("a", [2])
    query = [1, 2, 9]
    snap = run(aio, lambda c: snapshot(c, query))
    assert snap.match(query) == ref.match(query) == {"a": 1, "b": 3, "c": 1}
    assert [snap.fanout(h) for h in query] == [ref.fanout(h) for h in query]
    writer.apply_cleared("b")
    assert run(aio, lambda c: snapshot(c, query)).match(query) == {"a": 1, "c": 1}


def test_a_long_chain_is_stored_whole_in_one_call(clients):
    """The store script adds a replica's blocks to its set in chunks of 1,000 (Lua's unpack has a
    limit): a 2,500-block chain is held, chained and counted whole, in its one script call."""
    sync, _ = clients
    chain = list(range(10_000, 12_500))
    sync.config_resetstat()
    ix = RedisIndex(sync)
    ix.apply_stored("a", chain, 7)
    stats = sync.info("commandstats")
    # one script call (redis-py loads the script on its first); inside it, a holder and a parent link
    # per block, and the replica's set in 3 chunks
    assert stats["cmdstat_evalsha"]["calls"] - stats["cmdstat_evalsha"].get("failed_calls", 0) == 1
    assert stats["cmdstat_sadd"]["calls"] == 2500 + 2500 + 3
    ref = PrefixIndex()
    ref.apply_stored("a", chain, 7)
    assert ix.num_blocks("a") == ref.num_blocks("a") == 2500
    assert ix.match(chain) == ref.match(chain) == {"a": 2500}
    ends = (7, 10_000, 12_498, 12_499)
    assert [ix.fanout(h) for h in ends] == [ref.fanout(h) for h in ends]


def random_op(rng: random.Random, clears=("apply_cleared", "remove_replica"), p=(0.5, 0.85)) -> tuple:
    """One seeded index update: a store (with or without a parent), a removal (held or not) or a
    clear, on replica a, b or c of blocks 0-19."""
    replica, k = rng.choice("abc"), rng.random()
    if k < p[0]:
        return ("apply_stored", replica, rng.sample(range(20), rng.randint(1, 4)),
                rng.choice([None, rng.randrange(20)]))
    if k < p[1]:
        return ("apply_removed", replica, rng.sample(range(20), rng.randint(0, 3)))
    return (rng.choice(clears), replica)


def test_random_event_streams_leave_both_backends_answering_alike(clients):
    """Seeded streams of stores, removals (held or not), clears and removals of
    replicas; after each event both backends give the same answers."""
    sync, _ = clients
    for seed in range(40):
        sync.flushdb()
        rng, both = random.Random(seed), (RedisIndex(sync), PrefixIndex())
        for _ in range(40):
            op = random_op(rng)
            for index in both:
                getattr(index, op[0])(*op[1:])
            query = rng.sample(range(20), 4)
            seen = [(ix.match(query), [ix.fanout(h) for h in range(20)],
                     [ix.num_blocks(r) for r in "abc"], sorted(ix.replicas())) for ix in both]
            assert seen[0] == seen[1], (seed, op)


@pytest.mark.parametrize("max_args", [redis_index.MAX_ARGS, 5])
def test_a_batched_writer_ends_where_the_event_by_event_one_does(clients, monkeypatch, max_args):
    """The KV indexer applies everything waiting on its socket in one pipeline (`begin`/`flush`),
    as one script call (or, past MAX_ARGS arguments, several): the same seeded streams, batched
    in runs of up to 8 events, leave Redis as the in-memory index."""
    monkeypatch.setattr(redis_index, "MAX_ARGS", max_args)
    sync, _ = clients
    for seed in range(20):
        sync.flushdb()
        rng, writer, ref = random.Random(seed), RedisIndex(sync), PrefixIndex()
        for _ in range(10):
            writer.begin()
            for _ in range(rng.randint(1, 8)):
                op = random_op(rng, clears=("apply_cleared",), p=(0.55, 0.92))
                for index in (writer, ref):
                    getattr(index, op[0])(*op[1:])
            writer.flush()
            query = rng.sample(range(20), 4)
            assert writer.match(query) == ref.match(query), seed
            assert [writer.fanout(h) for h in range(20)] == [ref.fanout(h) for h in range(20)], seed
            assert [writer.num_blocks(r) for r in "abc"] == [ref.num_blocks(r) for r in "abc"], seed


def test_a_batch_that_meets_redis_without_its_scripts_fails_once_then_loads_them(clients):
    """A restarted Redis has no scripts: the batch's pipeline names them by SHA alone, so that
    flush fails (the indexer rewrites what it missed) and the next one loads them first."""
    sync, _ = clients
    writer = RedisIndex(sync)
    writer.begin()
    writer.apply_stored("a", [1, 2], None)
    writer.flush()
    sync.script_flush()
    writer.begin()
    writer.apply_stored("a", [3], 2)
    with pytest.raises(redis.exceptions.NoScriptError):
        writer.flush()
    writer.begin()
    writer.apply_stored("a", [3], 2)
    writer.flush()
    assert writer.held("a") == {1, 2, 3} and writer.fanout(2) == 1


def test_policy_runs_unchanged_on_a_snapshot(clients):
    sync, aio = clients
    RedisIndex(sync).apply_stored("warm", [7, 8, 9], None)
    snap = run(aio, lambda c: snapshot(c, [7, 8, 9]))
    from routing.policy.contracts import ReplicaLoad, RoutingRequest

    loads = {"warm": ReplicaLoad(running=1), "cold": ReplicaLoad(running=0)}
    d = BatonPolicy().route(RoutingRequest((7, 8, 9)), loads, snap, pins_view(60, None, None, 0), 0)
    assert (d.replica, d.reason, d.cached_blocks) == ("warm", "prefix", 3)


def test_routing_pins_the_session_in_redis_and_the_pin_expires(clients):
    from common.config import BatonConfig
    from deployments.front.metrics import IngressMetrics
    from deployments.front.request_routing import RequestRouting

    sync, aio = clients
    cfg = BatonConfig.model_validate({"routing": {"pin_ttl_s": 0.4, "local_index": False}})
    Registry.beat(sync, "decode", "r1", {"capacity_blocks": 100, "url": "http://127.0.0.1:1"})

    async def scenario(client):
        routing = RequestRouting(cfg, client, IngressMetrics())
        route = await routing.route(list(range(10)), "tenant", "s1")  # short: decode-only
        await asyncio.gather(*routing._pending)  # the pin write is not awaited by route()
        pinned = await client.get(redis_state.pin_key("decode", "s1"))
        await asyncio.sleep(0.6)
        return route, pinned, await client.get(redis_state.pin_key("decode", "s1"))

    route, pinned, later = run(aio, scenario)
    assert (route.decode_replica, route.decode_only, route.decode_url) == ("r1", True, "http://127.0.0.1:1")
    assert pinned == b"r1" and later is None


def test_prefill_looks_up_the_store_only_when_the_index_says_it_holds_more(clients):
    from common.config import BatonConfig
    from common.constants import STORE_REPLICA
    from deployments.front.metrics import IngressMetrics
    from deployments.front.request_routing import RequestRouting
    from routing.prefix.block_hash import hash_blocks

    sync, aio = clients
    cfg = REDIS_READS
    for pool, name in (("decode", "d1"), ("prefill", "p1")):
        Registry.beat(sync, pool, name, {"capacity_blocks": 100, "url": f"http://127.0.0.1:1/{name}"})
    prompt = list(range(200))  # 6 full blocks of 32

    def route():
        return run(aio, lambda c: RequestRouting(cfg, c, IngressMetrics()).route(prompt, "t", None))

    cold = route()
    assert cold.prefill_replica == "p1" and cold.prefill_lookup is False
    hashes = hash_blocks(prompt, cfg.model.block_size, "t")
    RedisIndex(sync).apply_stored(STORE_REPLICA, hashes[:4])
    held = route()
    assert held.prefill_lookup is True and held.predicted_cached_tokens == 4 * 32
    RedisIndex(sync).apply_stored("p1", hashes[:5])  # the prefill engine's own cache holds more
    assert route().prefill_lookup is False
    # ... unless prompts are queued ahead on it, which may evict some of it first
    sync.hset(redis_state.work_key("prefill"), redis_state.inflight_field("p1", "d1"), 12.5)
    assert route().prefill_lookup is True


def test_registry_drops_stale_heartbeats(clients):
    sync, aio = clients
    Registry.beat(sync, "decode", "fresh", {"capacity_blocks": 10})
    sync.hset("baton:replicas:decode", "stale", '{"capacity_blocks": 10, "ts": 1.0}')
    live = run(aio, lambda c: Registry(c, timeout_s=5).live("decode"))
    assert list(live) == ["fresh"] and live["fresh"]["capacity_blocks"] == 10


def test_a_request_with_no_live_decode_replica_is_counted(clients):
    from common.config import BatonConfig
    from deployments.front.metrics import IngressMetrics
    from deployments.front.request_routing import RequestRouting

    sync, aio = clients
    metrics = IngressMetrics()
    route = run(aio, lambda c: RequestRouting(REDIS_READS, c, metrics).route(list(range(50)), "t", None))
    assert route.reason == "no_replicas"
    assert 'baton_route_decisions_total{pool="decode",reason="no_replicas"} 1.0' in metrics.render().decode()
