import pytest

from deployments.admission import Permits


def test_acquire_until_full_then_refuse():
    p = Permits(2)
    assert p.try_acquire("r1", "a") and p.try_acquire("r2", "b")
    assert not p.try_acquire("r3", "a")
    assert (p.in_use, p.free) == (2, 0)
    assert p.in_use_by_tenant() == {"a": 1, "b": 1}


def test_double_release_is_a_noop_and_never_negative():
    p = Permits(2)
    p.try_acquire("r1", "a")
    assert p.release("r1") is True
    assert p.release("r1") is False
    assert p.release("never-held") is False
    assert (p.in_use, p.free) == (0, 2)
    assert p.in_use_by_tenant() == {}
    assert (p.acquired_total, p.released_total) == (1, 1)


def test_reacquire_by_same_holder_grants_no_second_permit():
    p = Permits(3)
    assert p.try_acquire("r1", "a") and p.try_acquire("r1", "a")
    assert p.in_use == 1 and p.in_use_by_tenant() == {"a": 1}


def test_capacity_shrink_revokes_nothing_and_grow_frees():
    p = Permits(3)
    for r in ("r1", "r2", "r3"):
        p.try_acquire(r, "a")
    p.set_capacity(1)
    assert (p.in_use, p.free) == (3, 0)
    p.release("r1")
    p.release("r2")
    assert not p.try_acquire("r4", "b")  # in_use 1 == capacity 1
    p.set_capacity(4)
    assert p.free == 3 and p.try_acquire("r4", "b")
    assert p.in_use_by_tenant() == {"a": 1, "b": 1}


def test_capacity_must_be_non_negative():
    with pytest.raises(ValueError):
        Permits(-1)
    p = Permits(0)
    assert not p.try_acquire("r1")
