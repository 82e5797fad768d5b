"""Measured capacity curves: tokens/s one replica sustains at each batch size, per pool.

A curve file is YAML (or JSON) stored beside the Baton config it belongs to:
`<config stem>.capacity.yaml` next to `<config stem>.yaml`. `bench/autoscale/capacity_curve.py`
writes one from a short calibration run against a running stack. Without one,
`load_for_config` returns the curve shipped for the default tiny CPU model
(deployments/autoscaling/capacity_tiny_cpu.yaml), whose numbers are derived from measured
`baton bench serve` figures; a file with no points for a pool makes callers
fall back to `target_ongoing_requests`.

Schema (`CapacityFile`; unknown keys are errors)::

    version: 1
    model: baton-tiny               # what was measured, free text
    hardware: 2-core VM, no GPU
    source: how the numbers were obtained
    engine_start_s: 60              # a new replica's start to serving, if measured
    pools:
      prefill:                      # prefill | decode | colocated
        unit: prompt_tokens         # what tokens_per_s counts
        tokens_per_request: 400     # mean work of one request in that unit when measured
        points:
          - {batch: 1, tokens_per_s: 712.0}
          - {batch: 8, tokens_per_s: 2591.0, ttft_s: 0.41}   # ttft_s optional: TTFT p90 at that batch

Between measured batch sizes throughput is linear in the batch; beyond the
largest it stays flat (no extrapolated gain), below the smallest it scales
down proportionally. The functions below turn a load in the pool's unit into
a replica count. Pure logic: no Ray.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_CURVE = Path(__file__).with_name("capacity_tiny_cpu.yaml")
SUFFIX = ".capacity.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CurvePoint(_Strict):
    batch: int = Field(gt=0, description="requests the replica runs at once")
    tokens_per_s: float = Field(gt=0, description="tokens/s the replica sustained at that batch")
    ttft_s: float | None = Field(None, gt=0, description="TTFT p90 of a request of tokens_per_request at that "
                                 "batch (closed loop), where measured")


class PoolCurve(_Strict):
    unit: Literal["prompt_tokens", "output_tokens"] = "prompt_tokens"
    tokens_per_request: float | None = Field(None, gt=0, description="mean tokens per request in the run")
    points: list[CurvePoint] = Field(default_factory=list)

    @field_validator("points")
    @classmethod
    def _sorted_unique(cls, v: list[CurvePoint]) -> list[CurvePoint]:
        v = sorted(v, key=lambda p: p.batch)
        if len({p.batch for p in v}) != len(v):
            raise ValueError("two points with the same batch size")
        return v

    def empty(self) -> bool:
        return not self.points

    def tokens_per_s(self, batch: float) -> float:
        """Throughput of one replica running `batch` requests at once (0 without points)."""
        pts = self.points
        if not pts or batch <= 0:
            return 0.0
        if batch <= pts[0].batch:
            return pts[0].tokens_per_s * batch / pts[0].batch
        for lo, hi in zip(pts, pts[1:]):
            if batch <= hi.batch:
                frac = (batch - lo.batch) / (hi.batch - lo.batch)
                return lo.tokens_per_s + frac * (hi.tokens_per_s - lo.tokens_per_s)
        return pts[-1].tokens_per_s

    def max_batch(self) -> int:
        return self.points[-1].batch if self.points else 0

    def service_s(self, batch: int, tokens: float) -> float:
        """Seconds one request of `tokens` takes when the replica runs `batch` at once."""
        tps = self.tokens_per_s(batch)
        return math.inf if tps <= 0 else tokens * batch / tps

    def ttft_measured(self) -> bool:
        """Whether every point carries the TTFT measured at its batch (and the request size it is for)."""
        return bool(self.points) and self.tokens_per_request is not None and \
            all(p.ttft_s is not None for p in self.points)

    def target_batch(self, tokens: float, budget_s: float) -> int:
        """The batch a pool is sized to run at (at least 1): the largest measured batch whose TTFT,
        scaled to requests of `tokens`, fits in `budget_s` where the curve measured TTFTs; else the
        largest measured-range batch whose per-request service of `tokens` does. A colocated
        replica's service is a whole answer, of which TTFT is only the prefill's share, so sizing it
        by service keeps replicas at batches whose first tokens come well within the budget."""
        if self.ttft_measured():
            scale = tokens / self.tokens_per_request
            fits = [p.batch for p in self.points if p.ttft_s * scale <= budget_s]
            return max(fits, default=1)
        best = 1
        for b in range(1, max(1, self.max_batch()) + 1):
            if self.service_s(b, tokens) <= budget_s:
                best = b
        return best


class CapacityFile(_Strict):
    version: Literal[1] = 1
    model: str = ""
    hardware: str = ""
    source: str = ""
    engine_start_s: float | None = Field(None, gt=0)
    pools: dict[Literal["prefill", "decode", "colocated"], PoolCurve] = Field(default_factory=dict)

    def curve(self, pool: str) -> PoolCurve:
        """The pool's curve; an empty one when the file has none."""
        return self.pools.get(pool) or PoolCurve()


def load(path: str | Path) -> CapacityFile:
    """Reads and validates a curve file (YAML or JSON). Raises ValueError naming the file."""
    p = Path(path)
    try:
        text = p.read_text()
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
        return CapacityFile.model_validate(data or {})
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ValueError(f"capacity curve {p}: {exc}") from None


def beside(config_path: str | Path) -> Path:
    """Where the curve of a config file lives: `<stem>.capacity.yaml` in its directory."""
    p = Path(config_path)
    return p.with_name(p.stem + SUFFIX)


def load_for_config(config_path: str | Path | None, explicit: str | Path | None = None) -> CapacityFile:
    """The curve for a config: `explicit` if given, else the file beside the config, else
    the shipped default for the tiny CPU model. Reads files only."""
    if explicit:
        return load(explicit)
    if config_path and beside(config_path).is_file():
        return load(beside(config_path))
    return load(DEFAULT_CURVE)


def replicas_for(load_tps: float, per_replica_tps: float) -> int:
    """Replicas that carry `load_tps` with each at `per_replica_tps` (0 for no load)."""
    if load_tps <= 0:
        return 0
    if per_replica_tps <= 0:
        raise ValueError("per-replica throughput must be positive")
    return int(math.ceil(load_tps / per_replica_tps - 1e-9))
