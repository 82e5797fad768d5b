"""A pool's `autoscaling` section, and its forecast part: `<pool>.autoscaling.forecast`.

Absent (null), a pool with `autoscaling` keeps the reactive in-flight policy
(deployments/autoscaling.in_flight_policy). Present, `baton deploy` gives the
pool Serve's forecast policy (deployments/autoscaling/scale_policy.py through
deployments/autoscaling/autoscaling.py) with these settings, Serve's own up/downscale
delays set to 0 (the policy's guard rails replace them). With `app_level` on
both pools (disaggregated), prefill and decode are decided together by one
application-level policy; the decode pool's section then holds the settings.
Serve takes an application-level policy only from a config deploy, not from
`serve.run`, so such an app is deployed through Serve's config path
(cluster/rollout.py, under `baton up` and `baton deploy` alike).

The capacity curve is read from `capacity_file`, else from
`<config stem>.capacity.yaml` beside the config file, else the shipped curve
of the default tiny CPU model (deployments/autoscaling/capacity.py). A pool whose curve
has no points is sized by its `target_ongoing_requests` on a forecast of its
in-flight count.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from common.config.base import _Strict


class ForecastAutoscaling(_Strict):
    forecaster: Literal["kalman", "holt", "constant"] = Field(
        "kalman", description="kalman: local linear trend (a Kalman filter); holt: damped "
        "trend exponential smoothing; constant: the recent level, flat (a baseline)"
    )
    app_level: bool = Field(
        True, description="disaggregated, set on the decode pool with both pools forecast: prefill and "
        "decode decided together by one application-level policy (Serve's autoscaling_policy of the "
        "application; this section's settings, each pool's own bounds); false: each pool on its own signals"
    )
    engine_start_s: float = Field(60.0, gt=0, description="a new replica's start until it serves")
    slo_ttft_s: float = Field(1.5, gt=0, description="TTFT SLO the prefill pool is sized for")
    service_fraction: float = Field(
        0.5, gt=0, lt=1, description="share of the SLO a request's own prefill may take at the pool's "
        "planned batch (its TTFT p90 there, where the capacity curve measured it); the rest is for "
        "queueing, and a queue wait beyond it adds a replica at once (so below 1: at 1 any wait at all would)"
    )
    utilization: float = Field(0.8, gt=0, le=1, description="planned share of a replica's throughput")
    z: float = Field(1.0, ge=0, description="forecast margin, in standard errors of the forecast")
    downscale_delay_s: float = Field(
        120.0, ge=0, description="the need must stay below the replica count this long before a scale-down"
    )
    cooldown_s: float = Field(
        600.0, ge=0, description="at most one change of direction (up to down or back) per this long; an "
        "urgent scale-up (short of replicas by the mean forecast) may still reverse a scale-down"
    )
    step_s: float = Field(5.0, gt=0, description="forecast bin")
    window: int = Field(120, ge=12, description="bins the model fits")
    refit_s: float = Field(300.0, gt=0, description="how often the model's parameters are re-estimated")
    signal_lag_s: float = Field(5.0, ge=0, description="age of the arrival counters: half Serve's metric push "
                                "interval (RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S, 10 s)")
    prompt_tokens: float = Field(400.0, gt=0, description="mean prompt tokens until replicas report them")
    output_tokens: float = Field(64.0, gt=0, description="mean output tokens until replicas report them")
    capacity_file: str | None = Field(
        None, description="capacity curve file; null: <config stem>.capacity.yaml beside the config, else "
        "the shipped tiny-CPU curve"
    )

    def policy_params(self) -> dict:
        """The fields deployments.autoscaling.scale_policy.PolicyParams takes (JSON-serialisable)."""
        return self.model_dump(exclude={"app_level", "capacity_file"})


class AutoscalingSection(_Strict):
    min_replicas: int = Field(1, ge=0, description="fewest replicas Serve keeps")
    max_replicas: int = Field(4, ge=1, description="most replicas Serve may start")
    target_ongoing_requests: float = Field(
        8, gt=0, description="requests in flight per replica that Serve steers towards"
    )
    upscale_delay_s: float | None = Field(
        None, ge=0, description="reactive policy: how long the need must stay above the replica count before "
        "Serve adds one; null: Serve's default (30 s). The forecast policy sets Serve's delays to 0"
    )
    downscale_delay_s: float | None = Field(
        None, ge=0, description="reactive policy: how long the need must stay below the replica count before "
        "Serve removes one; null: Serve's default (600 s)"
    )
    forecast: ForecastAutoscaling | None = Field(
        None, description="scale ahead of a forecast of the pool's load (deployments/autoscaling/scale_policy.py); "
        "null: the reactive policy, in-flight requests / target_ongoing_requests"
    )

    @model_validator(mode="after")
    def _bounds(self) -> "AutoscalingSection":
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must not exceed max_replicas")
        return self
