"""The KV index streamed to each front (deployments/kv_index/index_feed.py), on a real Redis: a front that
joins late loads what Redis holds and follows the feed; a gap makes it load again."""

from __future__ import annotations

import asyncio
import random

import msgspec
import pytest
import redis

from deployments.kv_index.index_feed import CHANNEL, FeedWriter, LocalIndex
from routing.prefix.prefix_index import PrefixIndex
from routing.prefix.redis_index import RedisIndex


def _ops(rng: random.Random, n: int) -> list[tuple]:
    out = []
    for _ in range(n):
        replica, k = rng.choice("abc"), rng.random()
        if k < 0.6:
            out.append(("apply_stored", replica, rng.sample(range(40), rng.randint(1, 4)),
                        rng.choice([None, rng.randrange(40)])))
        elif k < 0.95:
            out.append(("apply_removed", replica, rng.sample(range(40), rng.randint(0, 3))))
        else:
            out.append(("apply_cleared", replica))
    return out


def _same(local: PrefixIndex, ref: PrefixIndex) -> bool:
    queries = [list(range(i, i + 5)) for i in range(36)]
    return (all(local.match(q) == ref.match(q) for q in queries)
            and [local.fanout(h) for h in range(40)] == [ref.fanout(h) for h in range(40)]
            and [local.num_blocks(r) for r in "abc"] == [ref.num_blocks(r) for r in "abc"])


async def _until(cond, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.fixture
def sync(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    return client


@pytest.mark.parametrize("seed", range(6))
def test_a_front_joining_late_ends_with_the_indexers_index(redis_url, sync, seed):
    rng, ref, writer = random.Random(seed), PrefixIndex(), FeedWriter(RedisIndex(sync))

    def play(ops, batched):
        if batched:
            writer.begin()
        for op in ops:
            for index in (writer, ref):
                getattr(index, op[0])(*op[1:])
        if batched:
            writer.flush()

    async def scenario():
        client = redis.asyncio.Redis.from_url(redis_url)
        play(_ops(rng, 30), batched=False)  # before the front exists: only Redis has these
        local = LocalIndex(client)
        local.start()
        await _until(lambda: local.index is not None)
        for i in range(8):
            play(_ops(rng, rng.randint(1, 10)), batched=i % 2 == 0)
        await _until(lambda: local.index is not None and _same(local.index, ref))
        await local.stop()
        await client.aclose()
        return local.resyncs

    assert asyncio.run(scenario()) == 0


def test_a_gap_in_the_feed_makes_the_front_load_the_index_again(redis_url, sync):
    ref, writer = PrefixIndex(), FeedWriter(RedisIndex(sync))

    async def scenario():
        client = redis.asyncio.Redis.from_url(redis_url)
        local = LocalIndex(client)
        local.start()
        await _until(lambda: local.index is not None)
        for index in (writer, ref):
            index.apply_stored("a", [1, 2, 3])
        await _until(lambda: local.index is not None and local.index.match([1, 2, 3]) == {"a": 3})
        # a message the front never sees (sequence skipped), then the next one
        writer.seq += 1
        for index in (writer, ref):
            index.apply_stored("b", [1, 2])
        await _until(lambda: local.resyncs == 1)
        await _until(lambda: local.index is not None and _same(local.index, ref))
        for index in (writer, ref):  # followed in order again
            index.apply_removed("a", [3])
        await _until(lambda: local.index is not None and local.index.match([1, 2, 3]) == {"a": 2, "b": 2})
        sync.publish(CHANNEL, msgspec.msgpack.encode(["another-epoch", 1, []]))  # the indexer restarted
        await _until(lambda: local.resyncs == 2)
        await _until(lambda: local.index is not None and _same(local.index, ref))
        await local.stop()
        await client.aclose()

    asyncio.run(scenario())


def test_a_front_with_the_index_in_memory_predicts_what_one_reading_redis_does(redis_url, sync):
    """Same prefix prediction either way; in step with the feed, a decision sends Redis only the
    session's pin reads."""
    from common.config import BatonConfig
    from deployments.front.metrics import IngressMetrics
    from deployments.front.request_routing import RequestRouting
    from routing.prefix.block_hash import hash_blocks
    from routing.prefix.redis_state import Registry

    for name in ("d1", "d2"):
        Registry.beat(sync, "decode", name, {"capacity_blocks": 100, "url": f"http://127.0.0.1:1/{name}"})
    writer, prompt = FeedWriter(RedisIndex(sync)), list(range(200))
    writer.apply_stored("d2", hash_blocks(prompt, 32, "t")[:4])

    async def scenario():
        client = redis.asyncio.Redis.from_url(redis_url)
        out = {}
        for local in (False, True):
            cfg = BatonConfig.model_validate({"colocated": True, "routing": {"local_index": local}})
            front = RequestRouting(cfg, client, IngressMetrics(), "d1")
            first = await front.route(prompt, "t", "s1")
            if local:
                await _until(lambda: front.local.index is not None)
            cmds = int(sync.info("stats")["total_commands_processed"])
            again = await front.route(prompt, "t", "s2")
            out[local] = (first.decode_replica, first.predicted_cached_tokens, again.decode_replica,
                          again.predicted_cached_tokens, int(sync.info("stats")["total_commands_processed"]) - cmds)
            await asyncio.gather(*front._pending)
            if front.local:
                await front.local.stop()
        await client.aclose()
        return out

    out = asyncio.run(scenario())
    assert out[False][:4] == out[True][:4] == ("d2", 128, "d2", 128)
    assert out[True][4] < out[False][4] and out[True][4] <= 8  # pins and placement, no index slice
