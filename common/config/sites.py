"""Sites: this Baton deployment as one site among others (`sites:` in the config).

A site is one Baton deployment: its own Redis, Ray, pools and public front.
With `sites.name` set and `sites.peers` listed, every front of the site
probes the peers' public endpoints for their round-trip time and free
capacity (deployments/sites/site_link.py) and, when its own site is full, may run
a request on a near peer instead of queueing or refusing it
(routing/sites/site_select.py). Site-to-site calls carry a shared secret, the
site token, which every site of a deployment group holds.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from common.config.base import ConfigError, _Strict

SITE_TOKEN_ENV = "BATON_SITE_TOKEN"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


class SitePeer(_Strict):
    name: str = Field(description="the peer site's name, as it calls itself in its own sites.name")
    url: str = Field(description="the peer site's public endpoint, e.g. https://fra.example.com:8000")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://[^/\s]+$", v.rstrip("/")):
            raise ValueError("must be http(s)://host:port, no path")
        return v.rstrip("/")


class SitesConfig(_Strict):
    name: str | None = Field(None, description="this site's name; null: one site, no site routing")
    peers: list[SitePeer] = Field(default_factory=list, description="the other sites this one may send work to")
    token_file: str | None = Field(
        None, description=f"file holding the site token every site shares (or ${SITE_TOKEN_ENV}); "
        "site-to-site probes and forwarded requests must carry it")
    policy: Literal["random_near", "nearest_only", "local_only"] = Field(
        "random_near", description="how a full site picks another: random among the near ones weighted by "
        "free capacity, only its nearest neighbour, or none (answer 429 as one site would)")
    probe_s: float = Field(1.0, gt=0, description="seconds between probes of every peer")
    map_ttl_s: float = Field(5.0, gt=0, description="a peer not heard from for this long drops out of the map")
    busy_tau_s: float = Field(60.0, gt=0, description="time constant of the busy fraction a site reports "
                              "averaged (its load for spilling): about a session's life")
    turn_queue_places: int = Field(
        1, ge=0, description="queue places a session's turn may take beyond its tenant's and the total's bounds "
        "at the site that served its previous turn: moved, it would recompute its whole prompt")
    select: dict[str, Any] = Field(default_factory=dict,
                                   description="routing.sites.site_select.SiteSelectConfig fields (near, backoff, ...)")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not _NAME.match(v):
            raise ValueError("must be lowercase letters, digits, '-' or '_' (at most 63)")
        return v

    @model_validator(mode="after")
    def _peers(self) -> "SitesConfig":
        names = [p.name for p in self.peers]
        if self.peers and self.name is None:
            raise ValueError("peers need this site's own name (sites.name)")
        if len(set(names)) != len(names) or self.name in names:
            raise ValueError(f"peer names must be distinct and differ from sites.name: {names}")
        if self.map_ttl_s < 2 * self.probe_s:
            raise ValueError("map_ttl_s must be at least twice probe_s, or every late probe drops a peer")
        return self

    @property
    def enabled(self) -> bool:
        return self.name is not None and bool(self.peers)

    def token(self) -> str:
        """The site token from $BATON_SITE_TOKEN or `token_file`; ConfigError when neither gives one."""
        if os.environ.get(SITE_TOKEN_ENV):
            return os.environ[SITE_TOKEN_ENV]
        if self.token_file:
            try:
                text = Path(self.token_file).expanduser().read_text().strip()
            except OSError as exc:
                raise ConfigError(f"sites.token_file {self.token_file}: {exc.strerror}") from None
            if text:
                return text
        raise ConfigError(f"sites.token_file (or ${SITE_TOKEN_ENV}) must give the site token when sites.peers "
                          "is set: site-to-site calls are authenticated")
