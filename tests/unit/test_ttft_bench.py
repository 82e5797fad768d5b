"""bench ttft's reading of the span file: each hop's median, relative to the ingress span."""

from __future__ import annotations

import json

from bench.ttft.ttft import _hops


def _span(name: str, rid: str, start: str, end: str, **attrs) -> str:
    return json.dumps({"name": name, "start_time": f"2026-11-24T10:00:{start}Z", "end_time": f"2026-11-24T10:00:{end}Z",
                       "attributes": {"baton.request_id": rid, **attrs}})


def test_hops_are_medians_relative_to_the_ingress_span(tmp_path):
    lines = []
    for i, (pre, compute) in enumerate([(0.004, 0.020), (0.006, 0.030), (0.005, 0.025)]):
        rid = f"chatcmpl-{i}"
        lines += [_span("ingress", rid, "00.000000", "00.100000"),
                  _span("prefill", rid, f"{pre:09.6f}", "00.050000", **{"baton.compute_s": compute}),
                  _span("kv_load", rid, "00.040000", "00.052000")]
    lines.append(_span("prefill", "chatcmpl-other", "00.000000", "00.001000"))  # not asked for
    path = tmp_path / "traces.jsonl"
    path.write_text("\n".join(lines) + "\n")
    hops = _hops(path, ["chatcmpl-0", "chatcmpl-1", "chatcmpl-2", "chatcmpl-missing"])
    assert hops == {"prefill_starts_ms": 5.0, "prefill_compute_ms": 25.0, "kv_load_starts_ms": 40.0,
                    "decode_to_first_bytes_ms": 12.0}
