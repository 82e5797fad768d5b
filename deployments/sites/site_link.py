"""One front's link to the other sites: probes, the latency map, and forwarding.

Each front of a site (`sites:` in the config, common/config/sites.py)
- probes every peer site's `GET /baton/site` every `sites.probe_s`: the
  round trip goes into its latency map (routing/sites/latency_map.py) and the
  answer (the peer's free permits and queue wait) into its view of that
  site; a peer not heard from for `sites.map_ttl_s` drops out of both;
- answers the same probe for its own site (its admission's permits and
  queue, and its row of the map);
- before admitting a request, asks the site policy (routing/sites/site_select.py)
  where it should run: here, or on a near site with free capacity when
  this one is full and the round trip costs less than the wait here;
- forwards such a request to the chosen site's public endpoint and streams
  the answer back unbuffered (deployments/front/relay.py). A site that refuses it
  (429) or cannot be reached before the first byte is backed off and the
  policy chooses again (`sites.select.max_attempts` choices in all); then
  the request runs here after all: nothing that had not started is lost.

A peer's view is read for the request's tenant: a peer with no free permit
whose queue is full for that tenant (it names such tenants in its probe
answer) is taken as unable to queue it, as this site's own view is.

A session's turn keeps its site harder than new work: at the site that
served its previous turn (this one, as its policy found, or a peer, which
the forward tells with `x-baton-site-turn`) it may take
`sites.turn_queue_places` queue places beyond its tenant's and the total's
bounds. Moved, a turn would recompute its whole prompt; new work pays only
the round trip.

The map lives in each front's memory, rebuilt from its own probes, so sites
share no Redis and a dead site drops out by expiry alone.

`PUT /baton/site/policy` (site token) switches a front's policy without a
restart: an operator falling back to `local_only`, or `baton bench sites
--local` comparing policies on the same running sites.

Admission counts a request once, at the site that serves it: the first
site takes no permit for a request it forwards, and the serving site
admits it against the same tenant, which the site token vouches for
(`x-baton-site-tenant`); a forwarded request is never forwarded again.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections import OrderedDict

import aiohttp

from actors.finisher import header
from common.config import BatonConfig, ConfigError
from common.constants import SESSION_HEADER
from deployments.front import relay
from deployments.api.bodies import read_body
from deployments.api.schemas import APIError
from routing.sites.latency_map import LatencyMap
from routing.sites.site_policies import SITE_POLICIES, make_selector
from routing.sites.site_select import SiteDecision, SiteSelectConfig, SiteView

TOKEN_HEADER = "x-baton-site-token"
ORIGIN_HEADER = "x-baton-site-origin"
TENANT_HEADER = "x-baton-site-tenant"
SITE_HEADER = "x-baton-site"  # on answers: the site that served the request
TURN_HEADER = "x-baton-site-turn"  # on a forward: a turn of a session the site served before
_PASSED = (SESSION_HEADER, "x-baton-deadline-s", "x-baton-tier")
_SESSIONS = 65536
_FULL_TENANTS = 256  # the most tenants a probe answer names as queue-full
UNKNOWN_SERVICE_S = 1.0  # a permit's hold time before this site has measured one


def _busy(status: int, _first: bytes) -> bool:
    """A site's answer not relayed: it is full (429) or has no engine serving (503)."""
    return status in (429, 503)


def check(cfg: BatonConfig, source: str) -> None:
    """Checks the `sites:` section before anything starts: the token is readable and `sites.select`
    names SiteSelectConfig's fields. Raises ConfigError naming the field and the file."""
    if not cfg.sites.enabled:
        return
    try:
        cfg.sites.token()
        SiteSelectConfig(**cfg.sites.select)
    except ConfigError as exc:
        raise ConfigError(f"invalid config in {source}:\n  {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid config in {source}:\n  sites.select: {exc}") from None


class SiteLink:
    """A front's view of the other sites, and the calls that forward to them."""

    def __init__(self, cfg: BatonConfig, gate, http: aiohttp.ClientSession, metrics=None,
                 clock=time.monotonic) -> None:
        s = cfg.sites
        self.name, self.token = s.name, s.token()
        self.peers = {p.name: p.url for p in s.peers}
        self.cfg, self.gate, self.http, self.metrics, self.clock = cfg, gate, http, metrics, clock
        self.latency = LatencyMap(ttl_s=s.map_ttl_s)
        self.views: dict[str, tuple[SiteView, float]] = {}
        try:
            select = SiteSelectConfig(**s.select)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"sites.select: {exc}") from None
        self.selector = make_selector(s.policy, select, random.Random(cfg.routing.seed))
        self.sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()  # session -> (site, until)
        self._task: asyncio.Task | None = None
        self.busy_avg, self._busy_at = 0.0, None

    # -- probes -----------------------------------------------------------------

    def start(self) -> None:
        """Starts the probe loop on the running event loop."""
        self._task = asyncio.ensure_future(self._probe_loop())

    async def _probe_loop(self) -> None:
        while True:
            self._sample_busy()
            await asyncio.gather(*(self._probe(n, u) for n, u in self.peers.items()), return_exceptions=True)
            await asyncio.sleep(self.cfg.sites.probe_s)

    def _sample_busy(self) -> None:
        """Folds the busy fraction now into `busy_avg` (an EWMA with time constant `sites.busy_tau_s`)."""
        now, v = self.clock(), self.local_view()
        busy = 1.0 - v.permits_free / v.permits_total if v.permits_total else 1.0
        if self._busy_at is None:
            self.busy_avg = busy
        else:
            keep = math.exp(-(now - self._busy_at) / self.cfg.sites.busy_tau_s)
            self.busy_avg += (1.0 - keep) * (busy - self.busy_avg)
        self._busy_at = now

    async def _probe(self, name: str, url: str) -> None:
        """One probe of `name`: updates the map and its view on an answer; nothing on a failure."""
        t0 = self.clock()
        timeout = aiohttp.ClientTimeout(total=self.cfg.sites.probe_s * 2)
        async with self.http.get(f"{url}/baton/site", headers={TOKEN_HEADER: self.token}, timeout=timeout) as r:
            if r.status != 200:
                return
            answer = await r.json()
        now = self.clock()
        if answer.get("site") != name:
            return  # a misconfigured peer URL: never route to a site that is not the one named
        self.latency.observe(self.name, name, now - t0, now)
        for other, rtt in (answer.get("rtt_s") or {}).items():  # its row: the map is many-to-many
            if other != self.name:
                self.latency.observe(name, other, float(rtt), now)
        busy_avg = answer.get("busy_avg")
        self.views[name] = (SiteView(name, int(answer["permits_free"]), int(answer["permits_total"]),
                                     float(answer["queue_wait_s"]),
                                     busy_avg=float(busy_avg) if busy_avg is not None else None, as_of=now,
                                     queue_full_for=frozenset(map(str, answer.get("queue_full_tenants") or ()))),
                             now)
        if self.metrics is not None:
            self.metrics.site_rtt.labels(name).set(now - t0)

    def local_view(self, tenant: str | None = None, turn: bool = False) -> SiteView:
        """This site's free permits and the wait a new request would have here, from its admission
        (this front's share): none with a permit free, else its place in the queue times the
        measured service time per permit (UNKNOWN_SERVICE_S before any request has finished), or
        no end when the queue is full (the total's bound; `tenant`'s own too when given, read
        through `SiteView.for_tenant` as a peer's view is). `queue_full_for`: the tenants at their
        own bound here. `turn`: as a turn of a session this site served finds it, with
        `sites.turn_queue_places` more places in the queue (`turn_places`)."""
        snap, adm = self.gate.snapshot(), self.cfg.admission
        extra = self.cfg.sites.turn_queue_places if turn else 0
        free = max(0, snap.capacity - snap.permits_in_use - snap.queue_len)
        service = snap.service_time_s if snap.service_time_s is not None else UNKNOWN_SERVICE_S
        waiting = 0.0 if free else (snap.queue_len + 1) * service / max(1, snap.capacity)
        if not free and (snap.queue_len >= adm.max_queue_total + extra or adm.max_queue_per_tenant + extra == 0):
            waiting = math.inf  # full, or no tenant may queue at all
        full = frozenset(t for t, ts in snap.tenants.items() if ts.queue_len >= adm.max_queue_per_tenant + extra)
        return SiteView(self.name, min(free, snap.capacity), snap.capacity, waiting,
                        busy_avg=self.busy_avg if self._busy_at is not None else None,
                        queue_full_for=full).for_tenant(tenant)

    def answer(self) -> dict:
        """What a peer's probe gets: this site's capacity and its row of the latency map."""
        v, now = self.local_view(), self.clock()
        wait = v.queue_wait_s if math.isfinite(v.queue_wait_s) else 3600.0  # JSON has no infinity
        row = {n: rtt for n, rtt in self.latency.neighbours(self.name, now)}
        return {"site": self.name, "permits_free": v.permits_free, "permits_total": v.permits_total,
                "queue_wait_s": wait, "busy_avg": v.busy_avg, "rtt_s": row,
                "queue_full_tenants": sorted(v.queue_full_for)[:_FULL_TENANTS]}

    async def switch_policy(self, receive) -> dict:
        """`PUT /baton/site/policy` (site token checked by the caller): reads {"policy": name} and
        switches this front to a fresh policy of that name (no backoff, its RNG reseeded) and forgets
        its sessions' sites, as a restart with `sites.policy` set would. The next request is chosen
        by it. APIError 400 on a body that names no known policy."""
        raw = await read_body(receive, 4096)
        try:
            name = json.loads(raw)["policy"]
            selector = make_selector(name, self.selector.config, random.Random(self.cfg.routing.seed))
        except (ValueError, KeyError, TypeError) as exc:
            raise APIError(400, f"a body {{\"policy\": one of {', '.join(SITE_POLICIES)}}} is needed ({exc})",
                           param="policy") from None
        self.selector = selector
        self.sessions.clear()
        return {"site": self.name, "policy": name}

    # -- requests from other sites ---------------------------------------------

    def authorised(self, scope) -> bool:
        """Whether the request carries the site token; APIError 401 when it carries a wrong one."""
        token = header(scope["headers"], TOKEN_HEADER.encode())
        if not token:
            return False
        if token != self.token:
            raise APIError(401, "Incorrect site token", code="invalid_site_token")
        return True

    def forwarded_tenant(self, scope) -> str | None:
        """The tenant another site admitted this request for, if it is one (token checked), else None."""
        if not header(scope["headers"], ORIGIN_HEADER.encode()):
            return None
        if not self.authorised(scope):
            raise APIError(401, "A forwarded request must carry the site token", code="invalid_site_token")
        tenant = header(scope["headers"], TENANT_HEADER.encode())
        if not tenant:
            raise APIError(400, f"a forwarded request must say its tenant ({TENANT_HEADER})", param=TENANT_HEADER)
        return tenant

    # -- requests to other sites --------------------------------------------------

    def choose(self, session: str | None, tenant: str | None = None) -> SiteDecision:
        """Where a new request of `tenant` should run (this site or a peer). Changes the selector's RNG only."""
        now = self.clock()
        views = {n: v.for_tenant(tenant) for n, (v, seen) in self.views.items()
                 if now - seen <= self.cfg.sites.map_ttl_s}
        site = self._session_site(session, now)
        views[self.name] = self.local_view(tenant, turn=site == self.name)
        return self.selector.choose(self.name, views, self.latency, now, site)

    def turn_places(self, scope, forwarded: bool) -> int:
        """Queue places beyond the bounds that this request may take here (`sites.turn_queue_places`): a
        turn of a session this site served, as its own policy found it (`offload`) or as the origin
        says (`x-baton-site-turn`, believed only on a forward, which carries the site token); else 0."""
        if forwarded:
            turn = header(scope["headers"], TURN_HEADER.encode()) == "1"
        else:
            turn = bool(scope.get("baton.site_turn"))
        return self.cfg.sites.turn_queue_places if turn else 0

    def _session_site(self, session: str | None, now: float) -> str | None:
        if session is None or session not in self.sessions:
            return None
        site, until = self.sessions[session]
        return site if until > now else None

    def served_at(self, session: str | None, site: str) -> None:
        """Remembers the site a session's turn ran on (its prefix is there) for `routing.pin_ttl_s`."""
        if session is None:
            return
        self.sessions[session] = (site, self.clock() + self.cfg.routing.pin_ttl_s)
        self.sessions.move_to_end(session)
        while len(self.sessions) > _SESSIONS:
            self.sessions.popitem(last=False)

    async def offload(self, scope, receive, send, tenant: str, parse) -> tuple[bool, bytes | None]:
        """Runs the request on another site when the policy says so: (True, None) once that site
        answered it; else (False, body read or None) for this site to admit and run it. A refused
        forward is backed off and the policy chooses again, up to `max_attempts` choices, never
        the same site twice. `parse` validates the body first (raising the 4xx), so bad input
        never travels. Changes the policy's backoff and RNG and the session's site."""
        session = header(scope["headers"], SESSION_HEADER.encode()) or None
        raw, tried = None, set()
        for _ in range(self.selector.config.max_attempts):  # a refusal backs its site off: choose again
            decision = self.choose(session, tenant)
            if self.metrics is not None:
                self.metrics.site_decisions.labels(decision.reason).inc()
            turn = decision.reason == "session"
            if decision.site == self.name:
                scope["baton.site_turn"] = turn  # admitted here with the turns' places (`turn_places`)
            if decision.site is None or decision.site == self.name or decision.site in tried:
                break  # never offered twice to one site (a baseline has no backoff)
            tried.add(decision.site)
            if raw is None:
                raw = await read_body(receive, self.cfg.serve.max_body_bytes)
                parse(raw)
            if await self.forward(decision.site, scope, raw, tenant, send, turn):
                self.served_at(session, decision.site)
                return True, None
        self.served_at(session, self.name)
        return False, raw

    async def forward(self, site: str, scope, raw: bytes, tenant: str, send, turn: bool = False) -> bool:
        """Runs the request on `site`, streaming its answer to `send` (`turn`: a turn of a session `site`
        served, `TURN_HEADER`). False, with nothing sent, when the site refuses it or cannot be reached
        (it is then backed off); True once answered."""
        headers = {"content-type": "application/json", TOKEN_HEADER: self.token, ORIGIN_HEADER: self.name,
                   TENANT_HEADER: tenant}
        if turn:
            headers[TURN_HEADER] = "1"
        for name in _PASSED:
            if value := header(scope["headers"], name.encode()):
                headers[name] = value
        outcome = "served"
        try:
            await relay.run_remote(self.http, f"{self.peers[site]}{scope['path']}", raw, headers, send,
                                   [(SITE_HEADER.encode(), site.encode())], lambda timing: None,
                                   self.cfg.serve.request_timeout_s, refuse=_busy)
            self.selector.served(site, self.clock())
            return True
        except relay.UpstreamUnavailable as exc:
            outcome = "refused" if str(exc).startswith("refused") else "unreachable"
            self.selector.refused(site, self.clock())
            return False
        finally:
            if self.metrics is not None:
                self.metrics.site_forwards.labels(site, outcome).inc()
