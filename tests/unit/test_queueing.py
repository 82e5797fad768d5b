"""Erlang C and the load at which a site of c permits starts to queue (routing/sites/queueing.py)."""

from __future__ import annotations

import pytest

from routing.sites.queueing import busy_at_wait_chance, erlang_c


def test_busy_at_wait_chance_inverts_erlang_c():
    for servers in (1, 2, 8, 32):
        for chance in (0.1, 0.3, 0.6):
            busy = busy_at_wait_chance(servers, chance)
            assert erlang_c(servers, busy * servers) == pytest.approx(chance, abs=1e-4)
    assert busy_at_wait_chance(1, 0.3) == pytest.approx(0.3, abs=1e-5)  # M/M/1: P(wait) = rho
    # larger sites queue later
    assert busy_at_wait_chance(2, 0.3) < busy_at_wait_chance(8, 0.3) < busy_at_wait_chance(32, 0.3)


def test_busy_at_wait_chance_refuses_nonsense():
    for servers, chance in ((0, 0.3), (2, 0.0), (2, 1.0)):
        with pytest.raises(ValueError):
            busy_at_wait_chance(servers, chance)
