"""The site policies by name (the ``sites.policy`` setting, the bench's arms):
``random_near`` (``SiteSelector``, routing/sites/site_select.py), ``nearest_only`` and
``local_only`` (routing/sites/site_baselines.py)."""

from __future__ import annotations

import random

from routing.sites.site_baselines import LocalOnly, NearestOnly
from routing.sites.site_select import SiteSelectConfig, SiteSelector

SITE_POLICIES = ("random_near", "nearest_only", "local_only")


def make_selector(policy: str, config: SiteSelectConfig | None = None, rng: random.Random | None = None):
    """A fresh site policy by name, each with ``choose``, ``refused`` and ``served``:
    "random_near" (SiteSelector, using ``rng``), "nearest_only" or "local_only"
    (routing/sites/site_baselines.py, no randomness). Raises ValueError on another name."""
    if policy == "random_near":
        return SiteSelector(config, rng)
    if policy == "nearest_only":
        return NearestOnly(config)
    if policy == "local_only":
        return LocalOnly(config)
    raise ValueError(f"unknown site policy {policy!r}; known: {', '.join(SITE_POLICIES)}")
