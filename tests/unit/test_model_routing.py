"""deployments/model_routing.py: where a catalogue request runs, on a real Redis."""

import asyncio

import redis.asyncio

from deployments.model_routing import BALANCE_REQUESTS, ModelRouting, conversation_key


def test_a_chats_later_turns_keep_its_conversation_key():
    opening = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi, I am Ann."}]
    first = {"model": "m", "messages": opening}
    later = {"model": "m", "messages": opening + [{"role": "assistant", "content": "Hello Ann."},
                                                  {"role": "user", "content": "What is my name?"}]}
    assert conversation_key("t1", first) == conversation_key("t1", later)
    other = {"model": "m", "messages": [opening[0], {"role": "user", "content": "Hi, I am Bob."}]}
    assert conversation_key("t1", first) != conversation_key("t1", other)
    assert conversation_key("t1", first) != conversation_key("t2", first)  # caches are salted per tenant


def test_a_completion_conversation_is_keyed_by_its_opening_characters():
    opening = "x" * 3000
    assert conversation_key("t", {"prompt": opening}) == conversation_key("t", {"prompt": opening + " more"})
    assert conversation_key("t", {"prompt": "a"}) != conversation_key("t", {"prompt": "b"})
    assert conversation_key("t", {"prompt": [1, 2, 3]}).startswith("conv-")  # token ids


def _routing(url, entries):
    client = redis.asyncio.Redis.from_url(url)

    async def peers():
        return entries

    return ModelRouting("r1", peers, client, pin_ttl_s=60), client


def test_a_sessionless_conversation_follows_its_pin_until_that_replica_is_too_busy(redis_url):
    entries = {"r1": {"url": "http://r1", "resident": ["m"], "unfinished": 0},
               "r2": {"url": "http://r2", "resident": ["m"], "unfinished": 0}}

    async def scenario():
        r1, client = _routing(redis_url, entries)
        r2 = ModelRouting("r2", r1.peers, client, pin_ttl_s=60)
        key = conversation_key("t", {"messages": [{"role": "user", "content": "hello"}]})
        assert await r1.peer("m", None, True, key) is None  # runs on r1, which it pins
        route = await r2.peer("m", None, True, key)  # r2's front sends the next turn back to r1
        assert (route.decode_replica, route.reason) == ("r1", "conversation")
        entries["r1"]["unfinished"] = BALANCE_REQUESTS + 1  # r1 now much busier than r2
        assert await r2.peer("m", None, True, key) is None  # so the turn runs on r2, pinned there
        entries["r1"]["unfinished"] = 0
        assert await r1.peer("m", None, True, key) is not None  # and later turns follow to r2
        # An explicit session follows its pin whatever the load.
        assert await r1.peer("m", "s1", True) is None
        entries["r1"]["unfinished"] = 50
        route = await r2.peer("m", "s1", True)
        assert (route.decode_replica, route.reason) == ("r1", "pinned")
        await client.aclose()

    asyncio.run(scenario())
