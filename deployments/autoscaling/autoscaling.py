"""Serve autoscaling on what the replicas really carry: the reactive in-flight policy,
and the forecast policy of deployments/autoscaling/scale_policy.py at pool or application level.

Requests reach engine replicas over their own HTTP servers, never through a
Serve handle, so Serve's built-in count of ongoing requests stays at zero.
Each replica reports custom metrics instead (`EngineReplica.record_autoscaling_stats`,
filled by `SignalMeter`):

- `ongoing`: HTTP requests in flight;
- `arrivals`: inference requests this replica's public front (prefill replicas:
  its prefill endpoint) has received so far (a counter:
  the policy differences the latest timestamped values of `ctx.raw_metrics`, so
  the rate is fresh and not smeared over Serve's look-back);
- `prompt_tokens`, `prefix_hit`, `output_tokens`: per-answer means of the last
  interval (fronts only); `queue_wait_s`: mean admission wait; `permits_in_use`;
- `batch_prompt_tokens`, `batch_output_tokens`, `batch_due_s`: batch work the
  Batch API holds back, and when the oldest is due (the same app-wide figures
  from every replica that reports them).

Policies Serve calls (`autoscaling_config.policy.policy_function`):

- `in_flight_policy` (`POLICY`): as many replicas as the pool's in-flight
  requests / `target_ongoing_requests`. Serve wraps it with the pool's bounds
  and its up/downscale delays.
- `PoolForecastPolicy` (`FORECAST_POLICY`): a class; Ray 2.60 instantiates it
  once per deployment with `policy_kwargs` and calls it every control-loop tick,
  so the forecaster and guard rails live on the instance between calls. The
  returned `policy_state` only carries the last decision's figures; a move is
  logged to the controller's log with what the pool needed and the signals read.
- `AppForecastPolicy` (`APP_POLICY`): Serve's application-level policy (the
  application's `autoscaling_policy` in a Serve config): one call with every
  autoscaled deployment's context, prefill and decode decided together from one
  arrival forecast (scale_policy.AppPolicy).

Both forecast policies do their own delays and cool-down; deploy them with
Serve's `upscale_delay_s` and `downscale_delay_s` at 0, and with Serve recording
and pushing the replicas' stats once per forecast bin (`forecast_autoscaling`).
This module is pickled by value into the Serve controller; what it imports is
imported there (Baton is installed on every node).
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("ray.serve")  # the controller's log: serve/controller_*.log

METRIC = "ongoing"
ARRIVALS = "arrivals"
PROMPT_TOKENS, PREFIX_HIT, OUTPUT_TOKENS = "prompt_tokens", "prefix_hit", "output_tokens"
QUEUE_WAIT, PERMITS = "queue_wait_s", "permits_in_use"
BATCH_PROMPT, BATCH_OUTPUT, BATCH_DUE = "batch_prompt_tokens", "batch_output_tokens", "batch_due_s"
POLICY = "deployments.autoscaling.autoscaling:in_flight_policy"
FORECAST_POLICY = "deployments.autoscaling.autoscaling:PoolForecastPolicy"
APP_POLICY = "deployments.autoscaling.autoscaling:AppForecastPolicy"
PUBLIC_PATHS = ("/v1/chat/completions", "/v1/completions")  # counted where clients send them
PREFILL_PATH = "/baton/prefill"


def in_flight_policy(ctx) -> tuple[float, dict]:
    """Desired replicas from the `ongoing` metric; changes nothing."""
    if ctx.current_num_replicas == 0:
        return ctx.target_num_replicas, {}
    per_replica = (ctx.aggregated_metrics or {}).get(METRIC, {})
    total = sum(per_replica.values())
    return total / ctx.config.get_target_ongoing_requests(), {}


class SignalMeter:
    """The replica's side: counts arrivals and turns the front's Prometheus counters into
    per-interval means for `record_autoscaling_stats`."""

    def __init__(self, min_interval_s: float = 1.0) -> None:
        self.arrivals = 0
        self.min_interval_s = min_interval_s
        self._prev: tuple[float, dict[str, float]] | None = None
        self._means: dict[str, float] = {}

    def arrived(self, path: str, public: bool) -> None:
        """Counts one request: an inference request on the public front (`public`; not one
        another front forwarded to this replica's internal server, nor health, metrics or
        batch calls), or a prefill call on a prefill replica."""
        if path == PREFILL_PATH or (public and path in PUBLIC_PATHS):
            self.arrivals += 1

    def report(self, now: float, in_flight: float, metrics=None,
               batch: tuple[float, float, float] | None = None) -> dict[str, float]:
        """The metrics dict; `metrics` is the front's IngressMetrics (None on prefill
        replicas), `batch` (prompt tokens, output tokens, seconds until due) of work the
        Batch API holds. Updates the interval baseline once `min_interval_s` has passed."""
        out = {METRIC: float(in_flight), ARRIVALS: float(self.arrivals)}
        if metrics is not None:
            totals = _totals(metrics)
            if self._prev is None or now - self._prev[0] >= self.min_interval_s:
                if self._prev is not None:
                    self._means.update(_interval_means(self._prev[1], totals))
                self._prev = (now, totals)
            out.update(self._means)
            out[PERMITS] = totals["permits"]
        if batch is not None:
            out[BATCH_PROMPT], out[BATCH_OUTPUT], out[BATCH_DUE] = (float(x) for x in batch)
        return out


def _sum(metric, suffix: str, **labels: str) -> float:
    total = 0.0
    for family in metric.collect():
        for s in family.samples:
            if s.name.endswith(suffix) and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def _totals(m) -> dict[str, float]:
    return {"prompt": _sum(m.usage_tokens, "_total", kind="prompt"),
            "cached": _sum(m.usage_tokens, "_total", kind="cached"),
            "completion": _sum(m.usage_tokens, "_total", kind="completion"),
            "answers": _sum(m.usage_requests, "_total"),
            "wait_sum": _sum(m.queue, "_sum"), "wait_count": _sum(m.queue, "_count"),
            "permits": _sum(m.permits, "permits_in_use")}


def _interval_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    d = {k: after[k] - before[k] for k in after}
    out = {}
    if d["answers"] > 0:
        out[PROMPT_TOKENS] = d["prompt"] / d["answers"]
        out[OUTPUT_TOKENS] = d["completion"] / d["answers"]
        if d["prompt"] > 0:
            out[PREFIX_HIT] = d["cached"] / d["prompt"]
    if d["wait_count"] > 0:
        out[QUEUE_WAIT] = d["wait_sum"] / d["wait_count"]
    return out


def signals_from(ctx, kind: str):
    """A scale_policy.Signals from a Serve AutoscalingContext; `kind` is the pool's
    (prefill, decode or colocated) for the unit of its batch work."""
    from deployments.autoscaling.scale_policy import Signals

    agg = ctx.aggregated_metrics or {}
    raw = ctx.raw_metrics or {}
    arrivals = {str(rid): (ts[-1].timestamp, ts[-1].value) for rid, ts in raw.get(ARRIVALS, {}).items() if ts}

    def values(name: str) -> list[float]:
        return [v for v in (agg.get(name) or {}).values() if v is not None]

    def mean(name: str) -> float | None:
        v = values(name)
        return sum(v) / len(v) if v else None

    batch = values(BATCH_OUTPUT if kind == "decode" else BATCH_PROMPT)
    due = values(BATCH_DUE)
    return Signals(t=ctx.current_time or time.time(), ongoing=sum(values(METRIC)), arrivals=arrivals or None,
                   prompt_tokens=mean(PROMPT_TOKENS), prefix_hit=mean(PREFIX_HIT),
                   output_tokens=mean(OUTPUT_TOKENS), queue_wait_s=mean(QUEUE_WAIT),
                   permits_in_use=sum(values(PERMITS)) if values(PERMITS) else None,
                   running=ctx.current_num_replicas, deferrable_tokens=max(batch, default=0.0),
                   deferrable_due_s=min(due) if due else None)


def _pool_policy(kind: str, curve: dict | None, params: dict):
    from deployments.autoscaling.capacity import PoolCurve
    from deployments.autoscaling.scale_policy import ForecastPolicy, PolicyParams

    return ForecastPolicy(kind, PoolCurve.model_validate(curve or {}), PolicyParams(**params))


def _bound(policy, ctx) -> None:
    """Serve's capacity-adjusted bounds of this tick become the guard rails' bounds."""
    policy.rails.lo = ctx.capacity_adjusted_min_replicas
    policy.rails.hi = ctx.capacity_adjusted_max_replicas


def _log_change(name: str, current: int, wanted: int, policy, s) -> None:
    """One controller log line when a forecast policy moves a pool: what it needed and why
    (the forecast, the queue wait it read). Changes nothing else."""
    if wanted == current or policy.last is None:
        return
    need = policy.last
    detail = {k: round(v, 2) if isinstance(v, float) else v for k, v in need.detail.items()}
    log.info("baton autoscaling %s: %d -> %d at t=%.1f (now %d, ahead %d, urgent %s, hold %d, queue wait %s s, %s)",
             name, current, wanted, s.t, need.now, need.ahead, need.urgent, need.hold, s.queue_wait_s, detail)


def _state(policy) -> dict[str, Any]:
    need = policy.last
    return {} if need is None else {"baton_need": {"now": need.now, "ahead": need.ahead, "hold": need.hold,
                                                   "urgent": need.urgent}}


class PoolForecastPolicy:
    """Serve's deployment-level policy: one pool, forecast on its own signals.

    `policy_kwargs`: `kind` (prefill | decode | colocated), `curve` (a capacity.PoolCurve
    as a dict; empty: size by target_ongoing_requests) and `params` (PolicyParams fields)."""

    def __init__(self, kind: str = "decode", curve: dict | None = None, params: dict | None = None) -> None:
        self.kind = kind
        self.policy = _pool_policy(kind, curve, params or {})

    def __call__(self, ctx) -> tuple[int, dict]:
        """The pool's replica count; updates the forecaster and the guard rails."""
        if ctx.current_num_replicas == 0:
            return ctx.target_num_replicas, {}
        _bound(self.policy, ctx)
        signals = signals_from(ctx, self.kind)
        n = self.policy.decide(signals, ctx.target_num_replicas)
        _log_change(self.kind, ctx.target_num_replicas, n, self.policy, signals)
        return n, _state(self.policy)


class AppForecastPolicy:
    """Serve's application-level policy: prefill and decode from one forecast.

    `policy_kwargs`: `pools`, deployment name -> {"kind", "curve", "params"} as for
    PoolForecastPolicy; `lead`, the deployment whose fronts report arrivals and lengths
    (decode). Deployments not listed are left to Serve."""

    def __init__(self, pools: dict[str, dict] | None = None, lead: str = "decode") -> None:
        from deployments.autoscaling.scale_policy import AppPolicy

        pools = pools or {"decode": {"kind": "decode"}}
        self.kinds = {name: spec.get("kind", name) for name, spec in pools.items()}
        policies = {name: _pool_policy(self.kinds[name], spec.get("curve"), spec.get("params") or {})
                    for name, spec in pools.items()}
        self.app = AppPolicy(policies, lead=lead)

    def __call__(self, contexts: dict) -> tuple[dict, dict]:
        """Replica counts of the listed deployments; updates their forecaster and guard rails."""
        by_name = {dep.name: (dep, ctx) for dep, ctx in contexts.items() if dep.name in self.app.pools}
        if self.app.lead not in by_name:
            return {}, {}
        if any(ctx.current_num_replicas == 0 for _, ctx in by_name.values()):
            return {dep: ctx.target_num_replicas for dep, ctx in by_name.values()}, {}
        signals, current = {}, {}
        for name, (_, ctx) in by_name.items():
            _bound(self.app.pools[name], ctx)
            signals[name] = signals_from(ctx, self.kinds[name])
            current[name] = ctx.target_num_replicas
        if set(signals) != set(self.app.pools):
            return {}, {}
        counts = self.app.decide(signals, current)
        for name in counts:
            _log_change(name, current[name], counts[name], self.app.pools[name], signals[name])
        return ({dep: counts[name] for name, (dep, _) in by_name.items()},
                {dep: _state(self.app.pools[name]) for name, (dep, _) in by_name.items()})


def _spec(kind: str, bounds: dict, forecast, curves) -> dict:
    params = {**forecast.policy_params(), "min_replicas": int(bounds["min_replicas"]),
              "max_replicas": int(bounds["max_replicas"]),
              "target_ongoing_requests": float(bounds.get("target_ongoing_requests", 8.0))}
    return {"kind": kind, "curve": curves.curve(kind).model_dump(), "params": params}


def forecast_autoscaling(base: dict, kind: str, forecast, curves) -> dict:
    """Serve's `autoscaling_config` of a pool under PoolForecastPolicy: `base` (bounds and
    target as cluster/deploy.pool_autoscaling builds them) with Serve's delays at 0 and the
    policy swapped. `forecast`: a common.config.autoscale.ForecastAutoscaling; `curves`: a
    capacity.CapacityFile. Changes nothing."""
    # Serve records a replica's `record_autoscaling_stats` every 0.2 x look_back_period_s (6 s by
    # default) and pushes every metrics_interval_s: at most one forecast bin each, so that every bin
    # gets a fresh arrivals count (with a 0.5 s bin, the first rate came 25 s after the load).
    out = {**base, "upscale_delay_s": 0.0, "downscale_delay_s": 0.0,
           "metrics_interval_s": min(10.0, forecast.step_s), "look_back_period_s": min(30.0, 5 * forecast.step_s)}
    out["policy"] = {"policy_function": FORECAST_POLICY, "policy_kwargs": _spec(kind, base, forecast, curves)}
    return out


def app_autoscaling_policy(pools: dict[str, tuple[str, dict]], forecast, curves) -> dict:
    """The application's `autoscaling_policy` (a Serve config's application field) for
    AppForecastPolicy: `pools` maps deployment name -> (kind, its autoscaling_config)."""
    specs = {name: _spec(kind, bounds, forecast, curves) for name, (kind, bounds) in pools.items()}
    return {"policy_function": APP_POLICY, "policy_kwargs": {"lead": "decode", "pools": specs}}
