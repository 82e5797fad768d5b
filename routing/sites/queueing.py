"""Queueing formulas shared by the site policy and the prefill:decode model: Erlang C (M/M/c).

Pure functions, no clock and no I/O.
"""

from __future__ import annotations

from functools import lru_cache


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in M/M/c; ``offered`` = rate * E[S]."""
    if servers < 1:
        raise ValueError("need at least one server")
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    term, total = 1.0, 1.0  # a^k / k!, summed for k < c
    for k in range(1, servers):
        term *= offered / k
        total += term
    last = term * offered / servers * servers / (servers - offered)  # a^c/c! * c/(c-a)
    return last / (total + last)


@lru_cache(maxsize=256)
def busy_at_wait_chance(servers: int, chance: float) -> float:
    """The busy fraction (offered / servers) at which an arrival's chance of waiting in M/M/c
    reaches ``chance`` (0 < chance < 1): about 0.47 for 2 servers at 0.3, 0.72 for 8, 0.86 for 32.
    A small site starts to queue at a lower load than a large one. Bisection to 1e-6."""
    if servers < 1 or not 0.0 < chance < 1.0:
        raise ValueError("need servers >= 1 and 0 < chance < 1")
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if erlang_c(servers, mid * servers) > chance else (mid, hi)
    return lo
