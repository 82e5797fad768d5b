"""Baselines for site selection, with ``SiteSelector``'s interface.

* ``LocalOnly``: today's behaviour. A request runs on the site that received
  it: a free permit, or the site's queue when it admits the request (wait
  within ``max_queue_wait_s``); otherwise it is rejected.
* ``NearestOnly``: the local site as above; when it cannot take the request,
  only its single nearest live neighbour (the nearest unexpired entry of
  the latency map that is in the views with alive=True, at most
  ``near_max_rtt_s`` away), on the same terms; otherwise rejected. The
  classic "fail over to the next site" rule.

Neither follows sessions (a turn goes wherever the rule sends it) nor backs
off: ``refused`` and ``served`` change nothing. Pure: no clock, no I/O.
"""

from __future__ import annotations

from routing.sites.latency_map import LatencyMap
from routing.sites.site_select import SiteDecision, SiteSelectConfig, SiteView, can_queue


class LocalOnly:
    """Serve where the request arrived or reject. Stateless."""

    def __init__(self, config: SiteSelectConfig | None = None) -> None:
        self.config = config or SiteSelectConfig()

    def choose(self, origin: str, views: dict[str, SiteView], latency: LatencyMap, now: float,
               session_site: str | None = None) -> SiteDecision:
        """The origin when it can take the request, else a rejection. Changes nothing."""
        if can_queue(views.get(origin), self.config.max_queue_wait_s):
            return SiteDecision(origin, "local", 0.0)
        return SiteDecision(None, "rejected", 0.0)

    def refused(self, site: str, now: float) -> None:
        """No backoff: changes nothing."""

    def served(self, site: str, now: float) -> None:
        """No backoff: changes nothing."""


class NearestOnly(LocalOnly):
    """The origin, else its single nearest live neighbour, else reject. Stateless."""

    def choose(self, origin: str, views: dict[str, SiteView], latency: LatencyMap, now: float,
               session_site: str | None = None) -> SiteDecision:
        """The origin when it can take the request, else its nearest live neighbour when that
        can, else a rejection. Changes nothing."""
        cfg = self.config
        if can_queue(views.get(origin), cfg.max_queue_wait_s):
            return SiteDecision(origin, "local", 0.0)
        for name, rtt in latency.neighbours(origin, now):
            if rtt > cfg.near_max_rtt_s:
                break
            view = views.get(name)
            if view is not None and view.alive and view.permits_total > 0:
                if can_queue(view, cfg.max_queue_wait_s):
                    return SiteDecision(name, "nearest", rtt)
                break
        return SiteDecision(None, "rejected", 0.0)
