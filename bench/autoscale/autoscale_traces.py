"""Request-rate traces for `baton bench autoscale`, on compressed time.

A trace is a rate function (requests/s at second t) and a duration. Arrivals
are drawn from it by the simulator (Poisson, seeded). Times are compressed:
a day of traffic takes `day_s` seconds of trace, while an engine still takes
its real start time to serve, so a replica's start is a larger share of a
day than in production (the harder case for a reactive policy).

* `diurnal`: `days` compressed days, trough at 04:00 and peak at 16:00,
  smooth, with a slow +-6% wobble that differs from day to day.
* `ramp`: a flat low rate, a steep linear ramp to the peak, a hold, the ramp
  down and a flat tail.
* `spike`: a steady rate with short bursts of `spike_factor` times it, the
  load no forecaster sees coming (reactive parts of the policy handle them).

Batch requests (deferrable): `batch_jobs` lists (submitted at, requests,
due after); the Batch API holds them and the forecast policy may run them
in troughs. Pure functions: no clock, no randomness of their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Trace:
    name: str
    duration_s: float
    rate: Callable[[float], float]
    batch_jobs: tuple[tuple[float, int, float], ...] = field(default=())  # (at_s, requests, due_after_s)


def diurnal(peak_rps: float = 30.0, trough_rps: float = 3.0, day_s: float = 1800.0, days: int = 3) -> Trace:
    """`days` compressed days of `day_s` seconds each."""
    def rate(t: float) -> float:
        hour = (t / day_s * 24.0) % 24.0
        shape = ((1.0 - math.cos(2 * math.pi * (hour - 4.0) / 24.0)) / 2.0) ** 1.5
        wobble = 1.0 + 0.06 * math.sin(2 * math.pi * t / (day_s / 5.3) + t / day_s)
        return (trough_rps + (peak_rps - trough_rps) * shape) * wobble

    return Trace("diurnal", day_s * days, rate)


def ramp(low_rps: float = 3.0, peak_rps: float = 30.0, ramp_s: float = 300.0, hold_s: float = 900.0,
         flat_s: float = 600.0) -> Trace:
    """Flat, ramp up over `ramp_s`, hold, ramp down, flat."""
    def rate(t: float) -> float:
        edges = [flat_s, flat_s + ramp_s, flat_s + ramp_s + hold_s, flat_s + 2 * ramp_s + hold_s]
        if t < edges[0] or t >= edges[3]:
            return low_rps
        if t < edges[1]:
            return low_rps + (peak_rps - low_rps) * (t - edges[0]) / ramp_s
        if t < edges[2]:
            return peak_rps
        return peak_rps - (peak_rps - low_rps) * (t - edges[2]) / ramp_s

    return Trace("ramp", 2 * flat_s + 2 * ramp_s + hold_s, rate)


def held_ramp(low_rps: float, peak_rps: float, ramp_s: float, flat_s: float) -> Trace:
    """Flat, ramp up over `ramp_s`, then held at the peak for good (`baton bench autoscale --real`)."""
    return ramp(low_rps, peak_rps, ramp_s, hold_s=math.inf, flat_s=flat_s)


def spike(base_rps: float = 10.0, spike_factor: float = 2.5, spike_s: float = 120.0,
          at: tuple[float, ...] = (900.0, 2100.0), duration_s: float = 3000.0) -> Trace:
    """A steady rate with bursts of `spike_factor` times it, `spike_s` long, at `at`."""
    def rate(t: float) -> float:
        return base_rps * (spike_factor if any(a <= t < a + spike_s for a in at) else 1.0)

    return Trace("spike", duration_s, rate)


def with_batch(trace: Trace, requests: int, at: tuple[float, ...], due_after_s: float) -> Trace:
    """`trace` plus batch jobs of `requests` each, submitted at `at`, due `due_after_s` later."""
    jobs = tuple((a, requests, due_after_s) for a in at)
    return Trace(trace.name + "_batch", trace.duration_s, trace.rate, trace.batch_jobs + jobs)


def default_traces(day_s: float = 1800.0, batch_requests: int = 15000) -> dict[str, Trace]:
    """The bench's traces: diurnal, ramp, spike, and diurnal with a batch job each day
    submitted at its peak hour (16:00), due a compressed day later."""
    d = diurnal(day_s=day_s)
    peaks = tuple(day_s * (k + 16 / 24) for k in range(2))
    return {"diurnal": d, "ramp": ramp(), "spike": spike(),
            "diurnal_batch": with_batch(d, batch_requests, peaks, day_s)}
