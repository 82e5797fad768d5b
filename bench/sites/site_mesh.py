"""Sites on one machine: the delay proxies between them and each site's stack config.

Shared by `baton bench sites --local`, the chaos bench's site fault and the
sites e2e tests: each site is a colocated stack of one replica whose peers are
the other sites, each reached through a delay proxy of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bench.common.stack import write_config
from bench.sites.delay_proxy import DelayProxy


def delay_mesh(ports: dict[str, int], one_way: Callable[[str, str], float]) -> dict[tuple[str, str], DelayProxy]:
    """Starts one proxy per ordered pair of sites, (src, dst) -> the proxy through which src reaches
    dst's port, `one_way(src, dst)` seconds each way."""
    return {(s, d): DelayProxy(ports[d], one_way(s, d)).start() for s in ports for d in ports if s != d}


def site_config(workdir: Path, name: str, ports: dict[str, int], proxies: dict[tuple[str, str], DelayProxy],
                permits: int, queue: int, token_file: Path, decode: dict | None = None,
                sites: dict | None = None, serve: dict | None = None, **sections) -> Path:
    """Writes site `name`'s baton.yaml in `workdir` and returns its path: colocated, one replica
    (`decode` adds to it), `permits` engine permits and `queue` queued requests per tenant, on
    `ports[name]`, with every other site of `proxies` as a peer through its proxy. `sites` and
    `serve` add to those sections; `sections` are further ones, as `write_config` takes them."""
    peers = [{"name": dst, "url": proxy.url} for (src, dst), proxy in proxies.items() if src == name]
    return write_config(
        workdir, colocated=True, decode={"replicas": 1, **(decode or {})},
        serve={"port": ports[name], **(serve or {})},
        admission={"capacity_per_replica": permits, "max_queue_per_tenant": queue},
        sites={"name": name, "peers": peers, "token_file": str(token_file), "probe_s": 0.5,
               "map_ttl_s": 3.0, **(sites or {})},
        **sections)
