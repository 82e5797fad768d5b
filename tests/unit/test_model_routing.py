"""deployments/catalogue/model_routing.py: where a catalogue request runs, on a real Redis."""

import asyncio

import redis.asyncio

from deployments.catalogue.model_routing import (BALANCE_REQUESTS, BLOCK_CHARS, MAX_BLOCKS, ModelRouting, prefix_keys,
                                      prompt_text)


def test_a_chats_later_turns_extend_its_prefix_keys():
    system = {"role": "system", "content": "You are terse. " * 80}  # more than two blocks
    opening = [system, {"role": "user", "content": "Hi, I am Ann."}]
    first = prefix_keys("t1", {"model": "m", "messages": opening})
    later = prefix_keys("t1", {"model": "m", "messages": opening + [{"role": "assistant", "content": "Hello Ann."},
                                                                     {"role": "user", "content": "What is my name?"}]})
    assert len(first) >= 3 and later[:len(first)] == first  # the opening's key included
    short = [{"role": "user", "content": "Remember the word heron."}]
    turn2 = short + [{"role": "assistant", "content": "Heron."}, {"role": "user", "content": "And then?"}]
    assert prefix_keys("t1", {"messages": short})[0] == prefix_keys("t1", {"messages": turn2})[0]  # no full block
    assert prompt_text({"messages": opening + [{"role": "user", "content": "x"}]}).startswith(prompt_text(
        {"messages": opening}))
    other = prefix_keys("t1", {"model": "m", "messages": [system, {"role": "user", "content": "Hi, I am Bob."}]})
    shared = len(prompt_text({"messages": [system]})) // BLOCK_CHARS
    assert other[:shared] == first[:shared] and other[-1] != first[-1]  # the system prompt's blocks are shared
    assert prefix_keys("t2", {"messages": opening})[0] != first[0]  # caches are salted per tenant


def test_completion_prompts_are_keyed_by_their_characters():
    text = "x" * 3000
    assert prefix_keys("t", {"prompt": text + " more"})[:5] == prefix_keys("t", {"prompt": text})[:5]
    assert prefix_keys("t", {"prompt": "a"}) != prefix_keys("t", {"prompt": "b"})
    assert len(prefix_keys("t", {"prompt": [1, 2, 3]})) == 1  # token ids
    assert len(prefix_keys("t", {"prompt": "y" * BLOCK_CHARS * (MAX_BLOCKS + 5)})) == MAX_BLOCKS
    assert len(prefix_keys("t", {"prompt": ""})) == 1


def _routing(url, entries):
    client = redis.asyncio.Redis.from_url(url)

    async def peers():
        return entries

    return ModelRouting("r1", peers, client, pin_ttl_s=60), client


def test_a_sessionless_prompt_follows_its_prefix_until_that_replica_is_too_busy(redis_url):
    entries = {"r1": {"url": "http://r1", "resident": ["m"], "unfinished": 0},
               "r2": {"url": "http://r2", "resident": ["m"], "unfinished": 0}}

    async def scenario():
        r1, client = _routing(redis_url, entries)
        r2 = ModelRouting("r2", r1.peers, client, pin_ttl_s=60)
        key = prefix_keys("t", {"messages": [{"role": "user", "content": "hello"}]})
        assert await r1.peer("m", None, True, key) is None  # runs on r1, which it pins
        route = await r2.peer("m", None, True, key)  # r2's front sends the next turn back to r1
        assert (route.decode_replica, route.reason) == ("r1", "prefix")
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


def test_a_sessionless_prompt_goes_where_its_longest_prefix_ran(redis_url):
    entries = {"r1": {"url": "http://r1", "resident": ["m"], "unfinished": 0},
               "r2": {"url": "http://r2", "resident": ["m"], "unfinished": 0},
               "r3": {"url": "http://r3", "resident": ["other"], "unfinished": 0}}
    system = {"role": "system", "content": "Rules. " * 200}

    def chat(*contents):
        return prefix_keys("t", {"messages": [system, *({"role": "user", "content": c} for c in contents)]})

    async def scenario():
        r1, client = _routing(redis_url, entries)
        r2 = ModelRouting("r2", r1.peers, client, pin_ttl_s=60)
        assert await r1.peer("m", None, True, chat("a")) is None  # the system prompt runs on r1
        long = chat("b" * 3 * BLOCK_CHARS)
        entries["r1"]["unfinished"] = BALANCE_REQUESTS + 1
        assert await r2.peer("m", None, True, long) is None  # r1 too busy: r2 runs it, and its blocks
        entries["r1"]["unfinished"] = 0
        route = await r1.peer("m", None, True, chat("b" * 3 * BLOCK_CHARS, "more"))
        assert (route.decode_replica, route.reason) == ("r2", "prefix")  # the longer match wins
        # Another tenant shares no block: it runs where it lands.
        assert await r1.peer("m", None, True, prefix_keys("u", {"messages": [system]})) is None
        # A holder where the model is not resident is passed over.
        entries["r2"]["resident"] = []
        assert await r1.peer("m", None, True, chat("b" * 3 * BLOCK_CHARS, "more")) is None
        await client.aclose()

    asyncio.run(scenario())
