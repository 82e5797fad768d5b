"""A calibrated queueing model of a prefill/decode-disaggregated cluster.

Pure Python (no Ray, torch or network), so notebooks and tests can drive it.
It answers: for G GPUs split into P prefill and D decode engines, a workload
and latency SLOs, how much goodput does each GPU give, and which split wins?

Calibration (`calibrate`) turns low-load measurements into `Costs`:

- prefill: TTFT against input length on a colocated engine, a line
  ``a + prefill_per_token_s * n``. Its intercept ``a`` is split in two: one
  engine step (``prefill_fixed_s``, at most the decode step time below) keeps
  the engine busy; the rest (``overhead_s``: HTTP, tokenisation, Serve hops)
  adds to TTFT but occupies no GPU;
- decode: TPOT against the number of sequences decoding together, a line
  ``decode_step_s + decode_per_seq_s * batch``;
- KV transfer: disaggregated TTFT minus colocated TTFT at the same input
  lengths, a line ``kv_fixed_s + kv_per_token_s * n``.

Every fit takes the median of the repeats at each x first, then least
squares, so a noisy neighbour on a shared machine moves it little.

The model (`evaluate`), for arrival rate ``rate`` (Poisson):

- Prefill pool: an M/G/c queue with c = P. Service time of a request with n
  input tokens is ``prefill_fixed_s + prefill_per_token_s * (1 - prefix_hit) * n``.
  Waiting time is Erlang C (M/M/c) scaled by the Allen-Cunneen factor
  ``(1 + cs^2) / 2`` (cs: coefficient of variation of the service time),
  which is exact for M/D/1 and M/M/c. Its tail is taken as exponential with
  that mean: ``P(W > t) = C * exp(-t * (c/E[S] - rate) / k)``.
- TTFT = overhead + wait + prefill service + KV transfer of all n input
  tokens. Overhead and transfer add latency but keep no engine busy.
- Decode pool: D engines share the load evenly. By Little's law a decode
  engine holds ``batch = rate/D * out * TPOT(batch)`` sequences; with the
  linear TPOT this has the closed form
  ``batch = r*out*decode_step_s / (1 - r*out*decode_per_seq_s)`` (r = rate/D).
  No solution, or a batch above ``max_batch``, means the pool is overloaded.
- TPOT is the mean-field value ``TPOT(batch)``: every request sees it.
- SLO attainment = P(TTFT <= slo) * [TPOT <= slo], averaged over the input
  lengths of the workload; goodput = rate * attainment.

`max_rate` finds the highest arrival rate whose attainment still reaches a
target (0.9 by default, as in DistServe); that rate divided by P + D is the
goodput per GPU that `best_splits` ranks splits by.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from routing.sites.queueing import erlang_c


@dataclass(frozen=True)
class Line:
    """y = intercept + slope * x."""

    intercept: float
    slope: float

    def __call__(self, x: float) -> float:
        return self.intercept + self.slope * x


@dataclass(frozen=True)
class Costs:
    """Per-engine costs in seconds; what `calibrate` measures and `evaluate` uses."""

    prefill_fixed_s: float
    prefill_per_token_s: float
    decode_step_s: float
    decode_per_seq_s: float
    kv_fixed_s: float = 0.0
    kv_per_token_s: float = 0.0
    overhead_s: float = 0.0  # TTFT outside the engines (HTTP, tokenisation, Serve hops); no GPU busy
    max_batch: int = 256  # sequences one decode engine holds (vLLM max_num_seqs / KV memory)

    def __post_init__(self) -> None:
        for name in ("prefill_fixed_s", "prefill_per_token_s", "decode_step_s", "decode_per_seq_s",
                     "kv_fixed_s", "kv_per_token_s", "overhead_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.prefill_fixed_s + self.prefill_per_token_s <= 0 or self.decode_step_s <= 0:
            raise ValueError("prefill and decode must cost some time")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")

    def scaled(self, compute: float, memory: float | None = None, network: float | None = None,
               fixed: float = 1.0) -> "Costs":
        """These costs on faster hardware: a new `Costs`, this one unchanged.

        Prefill per-token cost is divided by ``compute`` (prefill is
        compute-bound); engine step costs (decode step, per-sequence, and the
        prefill step's fixed part) by ``memory`` (a step reads weights and
        KV); KV per-token cost by ``network``; the overheads outside the
        engines (``overhead_s``, ``kv_fixed_s``) by ``fixed``. ``memory`` and
        ``network`` default to ``compute``.
        """
        memory = compute if memory is None else memory
        network = compute if network is None else network
        if min(compute, memory, network, fixed) <= 0:
            raise ValueError("scale factors must be > 0")
        return replace(self, prefill_fixed_s=self.prefill_fixed_s / memory, overhead_s=self.overhead_s / fixed,
                       prefill_per_token_s=self.prefill_per_token_s / compute,
                       decode_step_s=self.decode_step_s / memory,
                       decode_per_seq_s=self.decode_per_seq_s / memory,
                       kv_fixed_s=self.kv_fixed_s / fixed, kv_per_token_s=self.kv_per_token_s / network)


@dataclass(frozen=True)
class Workload:
    """Traffic: Poisson arrivals at ``rate`` per second and sampled lengths.

    ``input_tokens`` and ``output_tokens`` are samples (or one value each);
    ``prefix_hit`` is the share of input tokens found in the prefix cache,
    which prefill skips but KV transfer still moves.
    """

    rate: float
    input_tokens: tuple[float, ...]
    output_tokens: tuple[float, ...]
    prefix_hit: float = 0.0
    name: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_tokens", tuple(self.input_tokens))
        object.__setattr__(self, "output_tokens", tuple(self.output_tokens))
        if self.rate < 0:
            raise ValueError(f"rate must be >= 0, got {self.rate}")
        if not self.input_tokens or not self.output_tokens:
            raise ValueError("need at least one input and one output length")
        if not 0 <= self.prefix_hit < 1:
            raise ValueError(f"prefix_hit must be in [0, 1), got {self.prefix_hit}")

    @property
    def mean_output(self) -> float:
        return statistics.fmean(self.output_tokens)

    def at(self, rate: float) -> "Workload":
        return replace(self, rate=rate)


@dataclass(frozen=True)
class Slo:
    """Latency targets of one request, and the share of requests that must meet both."""

    ttft_s: float
    tpot_s: float
    attainment: float = 0.9  # share of requests that must meet both, for `max_rate`


@dataclass(frozen=True)
class Estimate:
    """What `evaluate` predicts for one split at one rate. Times in seconds."""

    prefill: int
    decode: int
    rate: float
    prefill_util: float  # rate * E[service] / P
    decode_util: float  # rate/D * out * decode_per_seq_s: 1 is the pool's token capacity
    decode_batch: float  # sequences per decode engine (inf when overloaded)
    ttft_mean_s: float
    tpot_s: float
    attainment: float  # share of requests within both SLOs
    goodput_rps: float

    @property
    def gpus(self) -> int:
        return self.prefill + self.decode

    @property
    def goodput_per_gpu(self) -> float:
        return self.goodput_rps / self.gpus


# -- calibration ---------------------------------------------------------------


def fit_line(points: Iterable[tuple[float, float]]) -> Line:
    """Least squares through the median y at each distinct x.

    One distinct x gives a flat line through its median.
    """
    medians = _medians(points)
    if not medians:
        raise ValueError("no points to fit")
    xs = sorted(medians)
    ys = [medians[x] for x in xs]
    if len(xs) == 1:
        return Line(ys[0], 0.0)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return Line(my - slope * mx, slope)


def _nonneg(line: Line) -> Line:
    """Noise can tilt a fit below zero; costs cannot be."""
    return Line(max(0.0, line.intercept), max(0.0, line.slope))


def calibrate(prefill_ttft: Sequence[tuple[float, float]], decode_tpot: Sequence[tuple[float, float]],
              disagg_ttft: Sequence[tuple[float, float]] = (), max_batch: int = 256) -> Costs:
    """`Costs` from measurements at low load.

    ``prefill_ttft``: (input tokens, TTFT) on a colocated engine.
    ``decode_tpot``: (sequences decoding together, TPOT).
    ``disagg_ttft``: (input tokens, TTFT) through the disaggregated path at
    the same lengths; KV transfer is its excess over ``prefill_ttft``, per
    length, and zero when it is empty.
    """
    prefill = _nonneg(fit_line(prefill_ttft))
    decode = _nonneg(fit_line(decode_tpot))
    step = max(decode.intercept, 1e-6)
    engine_fixed = min(prefill.intercept, step)
    kv = Line(0.0, 0.0)
    if disagg_ttft:
        coloc = _medians(prefill_ttft)
        disagg = _medians(disagg_ttft)
        common = sorted(set(coloc) & set(disagg))
        if not common:
            raise ValueError("disaggregated and colocated TTFT share no input length")
        kv = _nonneg(fit_line((n, disagg[n] - coloc[n]) for n in common))
    return Costs(prefill_fixed_s=engine_fixed, prefill_per_token_s=prefill.slope,
                 decode_step_s=step, decode_per_seq_s=decode.slope, kv_fixed_s=kv.intercept,
                 kv_per_token_s=kv.slope, overhead_s=prefill.intercept - engine_fixed, max_batch=max_batch)


def _medians(points: Iterable[tuple[float, float]]) -> dict[float, float]:
    """The median y at each distinct x, NaNs dropped."""
    by_x: dict[float, list[float]] = {}
    for x, y in points:
        if not (math.isnan(x) or math.isnan(y)):
            by_x.setdefault(float(x), []).append(float(y))
    return {x: statistics.median(ys) for x, ys in by_x.items()}


# -- queueing --------------------------------------------------------------------


def wait_tail(servers: int, rate: float, mean_s: float, cv2: float, t: float) -> float:
    """P(wait > t) in M/G/c by Erlang C with the Allen-Cunneen correction."""
    if t < 0 or rate * mean_s >= servers:
        return 1.0
    c = erlang_c(servers, rate * mean_s)
    if c == 0.0:
        return 0.0
    return c * math.exp(-t * (servers / mean_s - rate) / ((1 + cv2) / 2))


def mean_wait(servers: int, rate: float, mean_s: float, cv2: float) -> float:
    offered = rate * mean_s
    if offered >= servers:
        return math.inf
    return erlang_c(servers, offered) * (1 + cv2) / 2 / (servers / mean_s - rate)


def decode_batch(rate_per_engine: float, mean_output: float, costs: Costs) -> float:
    """Little's law fixed point for the sequences one decode engine holds; inf if none."""
    load = rate_per_engine * mean_output
    denom = 1 - load * costs.decode_per_seq_s
    if denom <= 0:
        return math.inf
    batch = load * costs.decode_step_s / denom
    return batch if batch <= costs.max_batch else math.inf


# -- the model ---------------------------------------------------------------------


def evaluate(prefill: int, decode: int, workload: Workload, costs: Costs, slo: Slo) -> Estimate:
    """Predicted utilisations, latencies and goodput of a P:D split; changes nothing."""
    if prefill < 1 or decode < 1:
        raise ValueError("a disaggregated split needs at least one prefill and one decode engine")
    rate = workload.rate
    keep = 1 - workload.prefix_hit
    services = [costs.prefill_fixed_s + costs.prefill_per_token_s * keep * n for n in workload.input_tokens]
    kv = [costs.kv_fixed_s + costs.kv_per_token_s * n for n in workload.input_tokens]
    mean_s = statistics.fmean(services)
    cv2 = statistics.pvariance(services) / mean_s**2
    out = workload.mean_output
    batch = decode_batch(rate / decode, out, costs)
    tpot = math.inf if math.isinf(batch) else costs.decode_step_s + costs.decode_per_seq_s * batch
    wait = mean_wait(prefill, rate, mean_s, cv2)
    ttft = costs.overhead_s + wait + mean_s + statistics.fmean(kv)
    if math.isinf(wait) or tpot > slo.tpot_s:
        attainment = 0.0
    else:
        attainment = statistics.fmean(
            1 - wait_tail(prefill, rate, mean_s, cv2, slo.ttft_s - costs.overhead_s - s - k)
            for s, k in zip(services, kv))
    return Estimate(prefill=prefill, decode=decode, rate=rate, prefill_util=rate * mean_s / prefill,
                    decode_util=rate / decode * out * costs.decode_per_seq_s, decode_batch=batch,
                    ttft_mean_s=ttft, tpot_s=tpot, attainment=attainment, goodput_rps=rate * attainment)


def max_rate(prefill: int, decode: int, workload: Workload, costs: Costs, slo: Slo,
             iterations: int = 60) -> Estimate:
    """The estimate at the highest rate whose attainment reaches ``slo.attainment``.

    Attainment falls as the rate grows, so this bisects between 0 and the
    rate at which either pool saturates. Rate 0 when even an idle cluster
    misses the SLO.
    """
    mean_s = statistics.fmean(costs.prefill_fixed_s + costs.prefill_per_token_s * (1 - workload.prefix_hit) * n
                              for n in workload.input_tokens)
    out = workload.mean_output
    hi = prefill / mean_s
    if costs.decode_per_seq_s > 0:
        hi = min(hi, decode / (out * costs.decode_per_seq_s))
    hi = min(hi, decode * costs.max_batch / (out * (costs.decode_step_s + costs.decode_per_seq_s * costs.max_batch)))
    lo = 0.0
    if evaluate(prefill, decode, workload.at(1e-12), costs, slo).attainment < slo.attainment:
        return evaluate(prefill, decode, workload.at(0.0), costs, slo)
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if evaluate(prefill, decode, workload.at(mid), costs, slo).attainment >= slo.attainment:
            lo = mid
        else:
            hi = mid
    return evaluate(prefill, decode, workload.at(lo), costs, slo)


def best_splits(gpus: int, workload: Workload, costs: Costs, slo: Slo) -> list[Estimate]:
    """Every P:D split of ``gpus`` at its `max_rate`, best goodput per GPU first.

    Ties go to the split with fewer prefill engines.
    """
    if gpus < 2:
        raise ValueError("a disaggregated cluster needs at least 2 GPUs")
    estimates = [max_rate(p, gpus - p, workload, costs, slo) for p in range(1, gpus)]
    return sorted(estimates, key=lambda e: (-round(e.goodput_per_gpu, 12), e.prefill))
