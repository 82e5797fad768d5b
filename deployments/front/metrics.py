"""Prometheus metrics of one replica's front, served at GET /metrics.

Latency histograms (TTFT, TPOT, end-to-end, queue time), admission (permits
in use, shed requests per tenant), routing (decisions by reason, re-pins, the
block-weighted prefix hit ratio as the engines count it), KV bytes moved
from the Mooncake store into decode replicas, and usage a bill can be built
on: tokens per tenant, model and kind, and answers per tenant and model,
counted once per answer from the `usage` object its client receives (on
the replica that computed it; /metrics sums the replicas).
"""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from deployments import gc_pauses, loop_lag

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def kv_bytes_per_token(model_dir: Path, dtype: str) -> int:
    """K and V bytes one token occupies across all layers (from config.json)."""
    c = json.loads((model_dir / "config.json").read_text())
    heads = c["num_attention_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    kv_heads = c.get("num_key_value_heads") or heads
    size = _DTYPE_BYTES.get(dtype if dtype != "auto" else str(c.get("torch_dtype", "bfloat16")), 2)
    return 2 * c["num_hidden_layers"] * kv_heads * head_dim * size


class IngressMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.ttft = Histogram("baton_ttft_seconds", "time to first token", buckets=_LATENCY, registry=r)
        self.tpot = Histogram("baton_tpot_seconds", "time per output token after the first",
                              buckets=_LATENCY, registry=r)
        self.e2e = Histogram("baton_e2e_seconds", "request latency, end to end", buckets=_LATENCY, registry=r)
        self.queue = Histogram("baton_queue_seconds", "time waiting for an engine permit",
                               buckets=_LATENCY, registry=r)
        fine = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
        self.render_s = Histogram("baton_render_seconds", "chat template and tokenising, once per request (PD)",
                                buckets=fine, registry=r)
        self.route_s = Histogram("baton_route_seconds", "routing decision incl. its Redis round trip (PD)",
                               buckets=fine, registry=r)
        held = fine + (0.25, 0.5, 1.0)  # the process stopped: its collector's pauses, its loop's lag
        self.gc_pauses = Histogram("baton_gc_pause_seconds", "the garbage collector's pauses (deployments/"
                                   "gc_pauses.py)", ["generation"], buckets=held, registry=r)
        self.loop_lag = Histogram("baton_loop_lag_seconds", "how late the event loop woke a timer (deployments/"
                                  "loop_lag.py)", buckets=held, registry=r)
        self.permits = Gauge("baton_permits_in_use", "engine permits held", ["tenant"], registry=r)
        self.shed = Counter("baton_shed_total", "requests rejected with 429", ["tenant", "reason"], registry=r)
        self.admitted = Counter("baton_admitted_total", "requests given an engine permit", ["tenant"], registry=r)
        self.estimates = Gauge("baton_admission_estimate_seconds", "what a front's admission expects: service "
                               "(permit held), start (admission to first token)", ["replica", "estimate"],
                               registry=r)
        self.leased = Gauge("baton_permits_leased", "engine permits this front may grant now", ["replica"], registry=r)
        self.decisions = Counter("baton_route_decisions_total", "routing decisions", ["pool", "reason"], registry=r)
        self.repins = Counter("baton_repins_total", "session pins moved to another replica", ["pool"], registry=r)
        self.hit_blocks = Counter("baton_prefix_hit_blocks_total", "prompt blocks not recomputed", registry=r)
        self.prompt_blocks = Counter("baton_prompt_blocks_total", "full prompt blocks", registry=r)
        self.hit_ratio = Gauge("baton_prefix_hit_ratio", "block-weighted prefix hit ratio", registry=r)
        self.retries = Counter("baton_retries_total", "requests run on the front's own engine after the "
                               "decode replica it chose failed before their first token", registry=r)
        self.write_errors = Counter("baton_pin_write_errors_total", "routing writes (session pins, in-flight counts) "
                                  "Redis did not take", registry=r)
        self.kv_bytes = Counter("baton_kv_bytes_moved_total", "KV bytes loaded by decode from the store",
                                registry=r)
        self.predicted = Counter("baton_index_predicted_tokens_total",
                                 "cached prompt tokens the prefix index predicted on the computing replica", registry=r)
        self.actual = Counter("baton_index_actual_cached_tokens_total",
                              "cached prompt tokens that replica's engine reported", registry=r)
        self.usage_tokens = Counter("baton_usage_tokens_total", "tokens of answers, from the usage their client "
                                    "receives: prompt (all prompt tokens), cached (those of them not recomputed, "
                                    "as Baton counts them), completion", ["tenant", "model", "kind"], registry=r)
        self.usage_requests = Counter("baton_usage_requests_total", "answers that reported usage",
                                      ["tenant", "model"], registry=r)
        self.model_wakes = Counter("baton_model_wakes_total", "catalogue models started on this replica",
                                   ["model"], registry=r)
        self.model_wake_s = Histogram("baton_model_wake_seconds", "a catalogue model's engine start",
                                      ["model"], buckets=_LATENCY, registry=r)
        self.model_evictions = Counter("baton_model_evictions_total", "catalogue engines stopped: evicted "
                                       "for another model, or dropped after they died", ["model", "why"], registry=r)
        self.predictions = Counter("baton_index_predictions_total", "index predictions against the engine's "
                                   "report: exact, over or under", ["outcome"], registry=r)
        self._site_metrics(r)
        for outcome in ("exact", "over", "under"):
            self.predictions.labels(outcome)
        for pool in ("prefill", "decode"):
            self.repins.labels(pool)
        self._hits = self._blocks = 0
        self.before_render = None  # () -> None, set by the front

    def _site_metrics(self, r: CollectorRegistry) -> None:
        """Routing across sites (deployments/sites/site_link.py)."""
        self.site_decisions = Counter("baton_site_decisions_total", "the site policy's choices (a request refused "
                                      "by another site is chosen again): session, local, spill, wait_local, "
                                      "queue_remote, far, rejected", ["reason"], registry=r)
        self.site_forwards = Counter("baton_site_forwards_total", "requests sent to another site, by outcome: "
                                     "served, refused (429) or unreachable (then chosen again, or run here)",
                                     ["site", "outcome"], registry=r)
        self.site_rtt = Gauge("baton_site_rtt_seconds", "last probe round trip to each peer site", ["site"],
                              registry=r)

    def record_hit(self, hit_blocks: int, prompt_blocks: int) -> None:
        """Adds one request to the block-weighted hit ratio."""
        self._hits += hit_blocks
        self._blocks += prompt_blocks
        self.hit_blocks.inc(hit_blocks)
        self.prompt_blocks.inc(prompt_blocks)
        if self._blocks:
            self.hit_ratio.set(self._hits / self._blocks)

    def record_usage(self, info, usage: dict, tenant: str, model: str, block_size: int,
                     kv_bytes_per_token: int) -> None:
        """Adds one answer (a common.response.BatonInfo and the `usage` object its client
        receives) to the usage counters, to the hit ratio, to the index's predicted-versus-
        actual counts when the index routed it, and, when decode loaded what a prefill
        replica wrote, to the KV bytes moved."""
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        for kind, n in (("prompt", prompt_tokens), ("cached", cached),
                        ("completion", int(usage.get("completion_tokens") or 0))):
            self.usage_tokens.labels(tenant, model, kind).inc(n)
        self.usage_requests.labels(tenant, model).inc()
        self.record_hit(info.cached_tokens() // block_size, prompt_tokens // block_size)
        if info.prefill_cached_tokens is not None:
            self.kv_bytes.inc(info.decode_cached_tokens * kv_bytes_per_token)
        if info.predicted_cached_tokens is not None:  # routed by the index (not colocated)
            actual = info.decode_cached_tokens if info.decode_only else (info.prefill_cached_tokens or 0)
            predicted = info.predicted_cached_tokens
            self.predicted.inc(predicted)
            self.actual.inc(actual)
            outcome = "exact" if predicted == actual else "over" if predicted > actual else "under"
            self.predictions.labels(outcome).inc()

    def render(self) -> bytes:
        """The exposition text; first runs ``before_render`` (gauges read on demand) and adds the
        process's garbage-collection pauses (deployments/gc_pauses.py) and its event loop's lag
        (deployments/loop_lag.py) since the last render."""
        if self.before_render is not None:
            self.before_render()
        for generation, seconds in gc_pauses.drain():
            self.gc_pauses.labels(str(generation)).observe(seconds)
        for seconds in loop_lag.drain():
            self.loop_lag.observe(seconds)
        return generate_latest(self.registry)


def _label(value: str) -> str:
    """A label value as the exposition format writes it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def merge(texts: list[bytes]) -> bytes:
    """One exposition of several replicas' metrics: samples with the same
    name and labels are summed (a counter's `_created` is the earliest); the
    hit ratio is recomputed from the sums."""
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, tuple[str, str, dict]] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text.decode()):
            _, _, samples = families.setdefault(fam.name, (fam.type, fam.documentation, {}))
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                if s.name.endswith("_created") and key in samples:
                    samples[key] = min(samples[key], s.value)
                else:
                    samples[key] = samples.get(key, 0.0) + s.value
    hits = families.get("baton_prefix_hit_blocks", (None, None, {}))[2]
    blocks = families.get("baton_prompt_blocks", (None, None, {}))[2]
    if "baton_prefix_hit_ratio" in families:
        total = sum(blocks.values())
        families["baton_prefix_hit_ratio"][2][("baton_prefix_hit_ratio", ())] = (
            sum(hits.values()) / total if total else 0.0)
    lines = []
    for name, (kind, doc, samples) in families.items():
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
        for (sample, labels), value in samples.items():
            lab = ",".join(f'{k}="{_label(v)}"' for k, v in labels)
            lines.append(f"{sample}{{{lab}}} {value}" if lab else f"{sample} {value}")
    return ("\n".join(lines) + "\n").encode()
