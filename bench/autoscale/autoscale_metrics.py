"""What `baton bench autoscale` measures of one simulated run (bench/autoscale/autoscale_sim.py).

Everything before `warmup_s` (pools start at min_replicas) is left out.
Per run: interactive requests and their TTFT-SLO misses (a request misses
when arrival to the end of its prefill exceeds the SLO; one still waiting at
the end of the trace misses if its SLO had already passed), TTFT p50/p99,
replica-seconds per pool (a replica counts from the moment it is asked for,
starting included, until it leaves), direction changes per pool (a scale move
whose direction differs from the pool's previous move) and the most per 10
minutes of (compressed) trace time, batch requests done and done late, and a
time series every `sample_s` for the plots: trace rate, batch requests sent
to the pools per second, each pool's target and ready replicas, TTFT misses
in the interval.
"""

from __future__ import annotations

import math

import numpy as np

WINDOW_S = 600.0  # "per 10 compressed minutes"


class Recorder:
    """Accumulates one run; `step` and `moved` change it, `summary` reads it."""

    def __init__(self, cfg, pools: tuple[str, ...]) -> None:
        self.cfg = cfg
        self.replica_s = {p: 0.0 for p in pools}
        self.last_dir = {p: 0 for p in pools}
        self.changes = {p: [] for p in pools}  # times of direction changes
        self.moves = {p: 0 for p in pools}
        self.series: list[dict] = []
        self._next_sample = 0.0
        self.batch_sent = 0  # batch requests sent to the pools so far (the simulator counts)
        self._batch_sampled = 0

    def moved(self, pool: str, t: float, old: int, new: int) -> None:
        """Records a change of the pool's target from `old` to `new` at `t`."""
        direction = 1 if new > old else -1
        if self.last_dir[pool] not in (0, direction) and t >= self.cfg.warmup_s:
            self.changes[pool].append(t)
        self.last_dir[pool] = direction
        self.moves[pool] += 1

    def step(self, t: float, dt: float, pools: dict, rate: float) -> None:
        """Adds `dt` of every pool's replicas; samples the series every `sample_s`."""
        if t >= self.cfg.warmup_s:
            for name, pool in pools.items():
                self.replica_s[name] += len(pool.replicas) * dt
        if t + 1e-9 >= self._next_sample:
            point = {"t": round(t, 3), "rate": round(rate, 3),
                     "batch_rps": round((self.batch_sent - self._batch_sampled) / self.cfg.sample_s, 3)}
            self._batch_sampled = self.batch_sent
            for name, pool in pools.items():
                point[f"{name}_target"] = pool.target
                point[f"{name}_ready"] = pool.ready(t)
                point[f"{name}_in_flight"] = pool.in_flight()
            self.series.append(point)
            self._next_sample += self.cfg.sample_s

    def summary(self, trace, req: dict, first_token: np.ndarray, finished: np.ndarray) -> dict:
        """The run's metrics and its series (misses per interval added)."""
        slo, end = self.cfg.slo_ttft_s, trace.duration_s
        inter = ~req["batch"] & (req["arrive"] >= self.cfg.warmup_s)
        ttft = first_token - req["arrive"]
        waiting = np.isnan(ttft) & (req["arrive"] + slo < end)
        counted = inter & (~np.isnan(ttft) | waiting)
        missed = counted & (waiting | (ttft > slo))
        done_ttft = ttft[inter & ~np.isnan(ttft)]
        self._misses_into_series(req["arrive"][missed])
        return {
            "requests": int(counted.sum()),
            "ttft_slo_misses": int(missed.sum()),
            "ttft_miss_rate": round(float(missed.sum()) / max(1, int(counted.sum())), 5),
            "ttft_p50_s": _pct(done_ttft, 50),
            "ttft_p99_s": _pct(done_ttft, 99),
            "replica_seconds": round(sum(self.replica_s.values()), 1),
            "replica_seconds_by_pool": {p: round(v, 1) for p, v in self.replica_s.items()},
            "direction_changes": {p: len(v) for p, v in self.changes.items()},
            "max_direction_changes_per_10min": self._per_window(end),
            "direction_changes_per_10min": round(max(len(v) for v in self.changes.values())
                                                / ((end - self.cfg.warmup_s) / WINDOW_S), 3),
            "scale_moves": dict(self.moves),
            **self._batch(req, finished),
            "series": self.series,
        }

    def _per_window(self, end: float) -> int:
        """The most direction changes of any pool within any 10-minute window."""
        most = 0
        for times in self.changes.values():
            for i, start in enumerate(times):
                most = max(most, sum(1 for u in times[i:] if u < start + WINDOW_S))
        return most

    def _batch(self, req: dict, finished: np.ndarray) -> dict:
        batch = req["batch"]
        if not batch.any():
            return {}
        done = batch & ~np.isnan(finished)
        late = batch & (np.isnan(finished) | (finished > req["due"]))
        return {"batch_requests": int(batch.sum()), "batch_done": int(done.sum()), "batch_late": int(late.sum())}

    def _misses_into_series(self, at: np.ndarray) -> None:
        step = self.cfg.sample_s
        counts = np.bincount((at // step).astype(int), minlength=len(self.series))
        for i, point in enumerate(self.series):
            point["ttft_misses"] = int(counts[i]) if i < len(counts) else 0


def _pct(values: np.ndarray, q: float) -> float | None:
    if not len(values):
        return None
    v = float(np.percentile(values, q))
    return round(v, 4) if math.isfinite(v) else None


def aggregate(runs: list[dict], seeds: list[int]) -> dict:
    """One policy over several seeds of a trace: counts and replica-seconds summed, the
    worst 10-minute window of direction changes, each seed's figures, the first's series."""
    if len(runs) == 1:
        return {**runs[0], "seeds": seeds}
    out = {
        "requests": sum(r["requests"] for r in runs),
        "ttft_slo_misses": sum(r["ttft_slo_misses"] for r in runs),
        "replica_seconds": round(sum(r["replica_seconds"] for r in runs), 1),
        "direction_changes": {p: sum(r["direction_changes"][p] for r in runs) for p in runs[0]["direction_changes"]},
        "max_direction_changes_per_10min": max(r["max_direction_changes_per_10min"] for r in runs),
        "direction_changes_per_10min": max(r["direction_changes_per_10min"] for r in runs),
    }
    out["ttft_miss_rate"] = round(out["ttft_slo_misses"] / max(1, out["requests"]), 5)
    for key in ("batch_requests", "batch_done", "batch_late"):
        if key in runs[0]:
            out[key] = sum(r[key] for r in runs)
    keep = ("ttft_slo_misses", "replica_seconds", "max_direction_changes_per_10min", "ttft_p99_s", "batch_late")
    out["per_seed"] = [{"seed": s, **{k: r[k] for k in keep if k in r}} for s, r in zip(seeds, runs)]
    out["seeds"] = seeds
    out["series"] = runs[0].get("series", [])
    return out
