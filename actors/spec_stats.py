"""Speculative decoding's acceptance, counted in the replica that runs the engine.

vLLM's scheduler reports, with each step's stats, how many drafts it
proposed, how many draft tokens they held, and how many of those the target
model accepted (`SpecDecodingStats`, present when the engine logs stats,
which engine_args turns on for a pool with `speculation`). `SpecCounts` adds
them up; `stat_logger` is the AsyncLLM stat-logger factory that feeds it;
`SpecCollector` shows the totals in the front's /metrics and `summary` in
the heartbeat (so `baton status` prints them).
"""

from __future__ import annotations


class SpecCounts:
    """Running totals of one engine's speculation. Pure: no vLLM import."""

    def __init__(self) -> None:
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0

    def add(self, drafts: int, draft_tokens: int, accepted_tokens: int) -> None:
        """Adds one step's (or one report's) figures."""
        self.drafts += drafts
        self.draft_tokens += draft_tokens
        self.accepted_tokens += accepted_tokens

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted draft tokens / proposed draft tokens; None before any draft."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens a verifying step yields per draft: 1 (the target's own) plus the accepted ones."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else None

    def summary(self) -> dict[str, float]:
        """The totals and the two ratios (absent before any draft), for heartbeats and status."""
        out: dict[str, float] = {"spec_drafts": self.drafts, "spec_draft_tokens": self.draft_tokens,
                                 "spec_accepted_tokens": self.accepted_tokens}
        if self.drafts:
            out["spec_acceptance_rate"] = round(self.acceptance_rate, 4)
            out["spec_mean_accepted_length"] = round(self.mean_accepted_length, 3)
        return out


def stat_logger(counts: SpecCounts):
    """An AsyncLLM `stat_loggers` factory whose loggers add each step's speculation to `counts`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class SpecLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
            spec = getattr(scheduler_stats, "spec_decoding_stats", None)
            if spec is not None:
                counts.add(spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens)

        def log_engine_initialized(self) -> None:
            pass

    return SpecLogger


class SpecCollector:
    """A prometheus_client collector of a replica's speculation totals, labelled by pool."""

    def __init__(self, counts: SpecCounts, pool: str) -> None:
        self.counts, self.pool = counts, pool

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        for name, doc, value in (
                ("baton_spec_drafts", "speculative drafts proposed", self.counts.drafts),
                ("baton_spec_draft_tokens", "draft tokens proposed", self.counts.draft_tokens),
                ("baton_spec_accepted_tokens", "draft tokens the target model accepted",
                 self.counts.accepted_tokens)):
            family = CounterMetricFamily(name, doc, labels=["pool"])
            family.add_metric([self.pool], value)
            yield family
