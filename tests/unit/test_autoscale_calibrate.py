"""bench/autoscale/autoscale_calibrate.py: the real run's ramp is sized by the forecast policy's own sizing of the measured curve."""

from __future__ import annotations

import pytest

from bench.autoscale.autoscale_calibrate import planned_rps
from deployments.autoscaling.scale_policy import PolicyParams


def test_planned_rate_is_the_target_batch_rate_at_the_planned_utilization():
    curve = {"unit": "prompt_tokens", "tokens_per_request": 400,
             "points": [{"batch": 1, "tokens_per_s": 1000.0}, {"batch": 8, "tokens_per_s": 4000.0}]}
    # SLO 1.5 s, half of it for service: batch 5 is the largest whose 400 tokens take <= 0.75 s
    # (5 x 400 / 2714.3 tokens/s = 0.74 s), planned at 0.8 of its rate.
    assert planned_rps(curve, PolicyParams(slo_ttft_s=1.5)) == pytest.approx(0.8 * (1000 + 4 * 3000 / 7) / 400)
    # a looser SLO plans a bigger batch, so more requests per replica
    assert planned_rps(curve, PolicyParams(slo_ttft_s=4.0)) > planned_rps(curve, PolicyParams(slo_ttft_s=1.5))


def test_measured_ttfts_plan_the_batch_whose_first_tokens_fit():
    points = [{"batch": 1, "tokens_per_s": 1000.0, "ttft_s": 0.2}, {"batch": 8, "tokens_per_s": 4000.0, "ttft_s": 0.6}]
    curve = {"unit": "prompt_tokens", "tokens_per_request": 400, "points": points}
    # By service only batch 5 fits half of 1.5 s (above); batch 8's first tokens come in 0.6 s.
    assert planned_rps(curve, PolicyParams(slo_ttft_s=1.5)) == pytest.approx(0.8 * 4000 / 400)
