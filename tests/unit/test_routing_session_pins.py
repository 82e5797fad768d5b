import pytest

from routing.prefix.session_pins import SessionPins


def test_pin_and_get():
    pins = SessionPins(ttl_s=10)
    assert pins.get("s", now=0) is None
    assert pins.pin("s", "r1", now=0) is False
    assert pins.get("s", now=5) == "r1"


def test_ttl_expiry_and_refresh_on_read():
    pins = SessionPins(ttl_s=10)
    pins.pin("s", "r1", now=0)
    assert pins.get("s", now=9) == "r1"  # refreshed: now expires at 19
    assert pins.get("s", now=18) == "r1"  # refreshed: now expires at 28
    assert pins.get("s", now=28) is None
    assert len(pins) == 0


def test_repin_is_counted_only_when_a_live_pin_moves():
    pins = SessionPins(ttl_s=10)
    pins.pin("s", "r1", now=0)
    assert pins.pin("s", "r1", now=1) is False
    assert pins.pin("s", "r2", now=2) is True
    assert pins.repins == 1
    assert pins.pin("s", "r3", now=100) is False  # the old pin had expired
    assert pins.repins == 1
    assert pins.get("s", now=101) == "r3"


def test_expire_and_forget_replica():
    pins = SessionPins(ttl_s=10)
    pins.pin("a", "r1", now=0)
    pins.pin("b", "r2", now=5)
    pins.pin("c", "r2", now=5)
    assert pins.expire(now=12) == 1
    assert pins.get("a", now=12) is None
    assert pins.forget_replica("r2") == 2
    assert pins.get("b", now=12) is None and len(pins) == 0


def test_ttl_must_be_positive():
    with pytest.raises(ValueError):
        SessionPins(ttl_s=0)


def test_a_copied_pin_keeps_the_writers_expiry_and_peeking_refreshes_nothing():
    pins = SessionPins(ttl_s=10)
    pins.put("s", "r1", expires_at=5.0)
    assert pins.peek("s", 4.9) == "r1" and pins.peek("s", 5.0) is None
    assert pins.get("s", 4.0) == "r1"  # get refreshes: 4 + 10
    assert pins.peek("s", 13.9) == "r1"
    pins.put("s", "r2", expires_at=20.0)  # another holder moved it: no re-pin counted here
    assert pins.peek("s", 15) == "r2" and pins.repins == 0


def test_held_counts_each_replicas_pins_through_every_change():
    pins = SessionPins(ttl_s=10)
    pins.pin("a", "r1", now=0)
    pins.pin("b", "r1", now=0)
    pins.put("c", "r2", expires_at=5)
    assert (pins.held("r1"), pins.held("r2")) == (2, 1)
    pins.pin("b", "r2", now=1)  # moved
    assert (pins.held("r1"), pins.held("r2")) == (1, 2)
    assert pins.get("c", now=6) is None  # expired on read: dropped
    assert pins.held("r2") == 1
    pins.put("d", "r2", expires_at=8)
    assert pins.expire(now=9) == 1 and pins.held("r2") == 1  # d went, b (until 11) stays
    assert pins.forget_replica("r1") == 1 and pins.held("r1") == 0 and pins.held("nobody") == 0
