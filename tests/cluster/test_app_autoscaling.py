"""Prefill and decode scaled together by Serve's application-level policy, on a real Ray and Serve.

A disaggregated config whose pools both forecast, with `app_level` on, gives
`cluster.deploy.app_policy` an AppForecastPolicy; `cluster.rollout` deploys the
app through Serve's config path so that Serve runs it. The replicas here are
small Serve deployments, not engines: they report Baton's autoscaling metrics
through its own SignalMeter, the decode pool's front at a steady 9 requests/s,
the prefill pool nothing at all. Only a policy that sizes prefill from decode's
arrivals (the application-level one) gives prefill a second replica; each pool's
own policy would keep it at one.
"""

from __future__ import annotations

import sys
import time

import pytest

from cluster import loopback
from common.config import load_config
from common.constants import APP_NAME, RAY_NAMESPACE

PUSH_ENV = "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S"
# The default forecaster inside Serve's controller, on 0.5 s bins: Serve records and pushes the
# replicas' arrival counts once a bin (deployments/autoscaling/autoscaling.py forecast_autoscaling),
# so the first rates arrive within a second or two, before any fit (24 bins); until then the policy
# plans on the recent mean (tests/unit/test_forecast.py covers the fits).
FORECAST = "{step_s: 0.5, window: 40, refit_s: 5.0, engine_start_s: 5.0, downscale_delay_s: 600}"
CONFIG = f"""\
colocated: false
prefill:
  autoscaling: {{min_replicas: 1, max_replicas: 2, forecast: {FORECAST}}}
decode:
  autoscaling: {{min_replicas: 1, max_replicas: 1, forecast: {FORECAST}}}
"""


class Pool:
    """A pool's replica as Serve's autoscaler sees it: arrivals at `rate` per second."""

    def __init__(self, rate: float, downstream=None) -> None:
        from deployments.autoscaling.autoscaling import SignalMeter

        self.rate, self.t0, self.meter = rate, time.monotonic(), SignalMeter()

    def record_autoscaling_stats(self) -> dict[str, float]:
        now = time.monotonic()
        self.meter.arrivals = int(self.rate * (now - self.t0))
        return self.meter.report(now, 0.0)

    def __call__(self) -> str:
        return "ok"


@pytest.fixture(scope="module")
def serve_on_loopback():
    """A one-machine Ray on loopback with Serve, and this process's environment and Ray's
    cluster switch as they were afterwards (the next module's `ray up` needs its cluster mode)."""
    import ray
    from ray import cloudpickle, serve

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Serve's build task cannot import tests/
    with pytest.MonkeyPatch.context() as mp, loopback.local_ray():
        mp.setenv(PUSH_ENV, "0.5")  # the replicas' push interval, read where they start
        ray.init(num_cpus=2, include_dashboard=False, namespace=RAY_NAMESPACE, logging_level="ERROR",
                 log_to_driver=False, runtime_env={"env_vars": {PUSH_ENV: "0.5", **loopback.env()}})
        try:
            serve.start(proxy_location="Disabled")
            yield serve
        finally:
            serve.shutdown()
            ray.shutdown()
            cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _running(serve, name: str) -> int:
    app = serve.status().applications.get(APP_NAME)
    if app is None or name not in app.deployments:
        return 0
    return app.deployments[name].replica_states.get("RUNNING", 0)


def test_prefill_grows_with_decodes_arrivals_under_the_app_level_policy(serve_on_loopback, tmp_path):
    from ray import serve

    from cluster.deploy import app_policy, autoscaling_overrides, rewrite
    from cluster.rollout import rollout
    from common.progress import Progress
    from deployments.autoscaling.autoscaling import APP_POLICY

    path = tmp_path / "baton.yaml"
    path.write_text(CONFIG)
    cfg = load_config(path)
    policy = app_policy(cfg, path)
    assert policy["policy_function"] == APP_POLICY and set(policy["policy_kwargs"]["pools"]) == {"prefill",
                                                                                                  "decode"}
    deployment = serve.deployment(Pool, ray_actor_options={"num_cpus": 0})
    prefill = deployment.options(name="prefill").bind(0.0)
    app = rewrite(deployment.options(name="decode").bind(9.0, prefill), autoscaling_overrides(cfg, path))
    rollout(app, Progress(total=0), 120, app_policy=policy)
    assert serve.status().applications[APP_NAME].status.value == "RUNNING"
    assert _running(serve_on_loopback, "prefill") == 1

    deadline = time.monotonic() + 120
    while _running(serve_on_loopback, "prefill") < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    # 9 requests/s of 400 prompt tokens is more than one prefill replica's share of the curve.
    assert _running(serve_on_loopback, "prefill") == 2
    assert _running(serve_on_loopback, "decode") == 1  # its max
