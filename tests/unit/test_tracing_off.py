"""common/tracing.py while no exporter is set up (`tracing.exporter: none`, the default): the
request path's spans and carriers cost nothing and look as OTel's no-op ones would. The exporting
side is tests/e2e/test_serving.py's `test_spans_cover_the_request_path`."""

from __future__ import annotations

from common import tracing


def test_spans_and_carriers_are_no_ops_without_an_exporter():
    assert not tracing._exporting  # no unit test sets an exporter up: it would be the process's for good
    t = tracing.tracer()
    span = t.start_span("decode", context=tracing.extract({"traceparent": "00-abc-def-01"}))
    span.set_attribute("baton.request_id", "r")
    kv = t.start_span("kv_load", context=tracing.context_of(span))
    kv.end()
    span.end()
    with t.start_as_current_span("ingress") as current:
        current.set_attribute("baton.route", "load")
        assert tracing.inject() == {}  # what OTel's no-op span context injects too
