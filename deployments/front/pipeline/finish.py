"""Stage 8, finish: the one place a request ends.

It runs when the engine has produced the whole answer (relay.py calls it then,
however slowly the client reads: that is the permit's early release), and
again after any stage that failed or was cancelled; only the first call frees
anything. It releases the request's engine permit, ends its in-flight counts
on its replicas, lets a catalogue model it held go, and records its latency.
"""

from __future__ import annotations

from deployments.front import relay
from deployments.front.pipeline.request import Request


class Finish:
    """Ends requests of one front: `gate` its admission, `placement` its route strategy
    (route.py), `models` its model strategy (models.py)."""

    def __init__(self, gate, metrics, placement, models) -> None:
        self.gate, self.metrics, self.placement, self.models = gate, metrics, placement, models

    def __call__(self, req: Request, timing: relay.Timing | None = None) -> None:
        """Frees what `req` holds (once); with the relay's `timing` of a 200 answer, records its latency."""
        if not req.finished:
            req.finished = True
            permit = req.permit
            if permit is not None and not permit.released:
                permit.release()
                self.metrics.permits.labels(req.tenant).dec()
            self.placement.finished(req.route)
            self.models.finished(req)
        if timing is not None and timing.status == 200:
            self._observe(req, timing)

    def _observe(self, req: Request, timing: relay.Timing) -> None:
        m = self.metrics
        if timing.first_body is not None and timing.events and req.permit.ticket.admitted_at is not None:
            self.gate.observe_start(timing.first_body - req.permit.ticket.admitted_at)
        m.e2e.observe(timing.ended - timing.started)
        if timing.first_body is not None:
            m.ttft.observe(timing.first_body - timing.started)
            if timing.events > 3:
                m.tpot.observe((timing.ended - timing.first_body) / (timing.events - 3))
