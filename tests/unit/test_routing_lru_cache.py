import pytest

from routing.prefix.lru_cache import LRUBlockCache


def test_insert_reports_stored_and_touches_head_last():
    c = LRUBlockCache(4)
    assert c.insert([1, 2, 3]) == ([1, 2, 3], [])
    assert c.lru_order() == [3, 2, 1]  # the head of the prompt is MRU


def test_eviction_order_is_exact():
    c = LRUBlockCache(4)
    c.insert([1, 2, 3])
    assert c.insert([4, 5]) == ([4, 5], [3])
    assert c.lru_order() == [2, 1, 5, 4]
    # Touching 1, 2 and adding 6 evicts the least recently used block, 5.
    assert c.insert([1, 2, 6]) == ([6], [5])
    assert c.lru_order() == [4, 6, 2, 1]
    assert c.free == 0 and len(c) == 4


def test_prefix_hits_stop_at_first_miss():
    c = LRUBlockCache(8)
    c.insert([1, 2, 3, 4])
    assert c.prefix_hits([1, 2, 3, 9, 4]) == 3
    assert c.prefix_hits([2, 3]) == 2
    assert c.prefix_hits([9, 1]) == 0
    assert c.lru_order() == [4, 3, 2, 1]  # queries do not touch


def test_prompt_longer_than_capacity_keeps_its_head():
    c = LRUBlockCache(3)
    stored, evicted = c.insert([1, 2, 3, 4, 5])
    assert stored == [1, 2, 3] and evicted == []
    assert c.prefix_hits([1, 2, 3, 4, 5]) == 3


def test_clear_and_bad_capacity():
    c = LRUBlockCache(3)
    c.insert([1, 2])
    assert c.clear() == [2, 1]
    assert len(c) == 0
    with pytest.raises(ValueError):
        LRUBlockCache(0)
