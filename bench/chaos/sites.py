"""The sites' fault: a whole site killed while another sends it work.

`baton bench chaos --layout sites` starts two sites on this machine (colocated
stacks of one replica each) that reach each other through delay proxies
(bench/sites/delay_proxy.py, 10 ms each way). Site `a` takes the traffic and
has few engine permits, so what it cannot take it forwards to `b`.

The fault (`site`) SIGKILLs every process of site `b` at once: its `baton up`
and everything that started (Ray and its replicas, the engines, Redis, the
Mooncake processes), as a lost machine or a power cut would. The site comes
back the way an operator's (or a supervisor's) restart brings it: `baton up`
again on the same config, at once. What must hold at `a`: no request hangs
and none is cut silently; requests it had forwarded to `b` end with an
answer or a clean error; and `b` is reachable on `a`'s path again once it is
back (the requests `a` had `b` serve before the kill and by the end are
reported).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from bench.common.stack import StackProcess
from bench.sites.site_mesh import delay_mesh, site_config
from bench.sites.sites_local import ONE_THREAD
from common.processes import free_ports

NAME = "site"
DELAY_S = 0.010  # one way, between the two sites
TOKEN = "bench-chaos-site-token"
PERMITS = {"a": 2, "b": 4}  # engine permits per site: `a` fills first


class SitePair:
    """Sites `a` and `b` and their two delay proxies, started and stopped together."""

    def __init__(self, workdir: Path) -> None:
        self.ports = dict(zip("ab", free_ports(2)))
        self.proxies = delay_mesh(self.ports, lambda src, dst: DELAY_S)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "site_token").write_text(TOKEN)
        self.stacks = {
            name: StackProcess(site_config(
                workdir / name, name, self.ports, self.proxies, PERMITS[name], 16, workdir / "site_token",
                decode={"env": ONE_THREAD}, sites={"select": {"near_max_rtt_s": 1.0}},  # a Python proxy on 2 busy cores
                tracing={"exporter": "none"}, batch={"lease_s": 6},
                routing={"heartbeat_s": 1, "replica_timeout_s": 3}))
            for name in "ab"}

    def start(self) -> None:
        """Starts both sites, one after the other (each start takes both cores)."""
        try:
            for s in self.stacks.values():
                s.start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stops both sites and the proxies."""
        for s in self.stacks.values():
            s.stop()
        for p in self.proxies.values():
            p.close()


def forwarded(stack: StackProcess | None) -> float | None:
    """Requests this site has had served by other sites so far (its front's metrics); None where
    there is no stack or it does not answer."""
    try:
        text = httpx.get(f"{stack.url}/metrics", timeout=10).text if stack is not None else None
    except httpx.HTTPError:
        return None
    if text is None:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("baton_site_forwards_total{") and 'outcome="served"' in line)


class SiteFault:
    """`site`: the interface of faults.Fault (applies, prepare, inject, recovered, report)."""

    name = component = NAME
    freeze_s = None

    def __init__(self, pair: SitePair | None):
        self.pair = pair
        self.stack = pair.stacks["a"] if pair is not None else None  # where the traffic goes
        self.restart: threading.Thread | None = None
        self.restart_s: float | None = None
        self.error: str | None = None
        self.killed = 0
        self.sent_before: float | None = None

    def applies(self) -> bool:
        """Whether there are sites to kill one of."""
        return self.pair is not None

    def prepare(self) -> None:
        """Nothing: the traffic itself makes `a` forward."""

    def inject(self) -> str:
        """SIGKILLs every process of site `b`, then starts it again in a thread. Changes the stack."""
        import psutil

        a, b = self.pair.stacks["a"], self.pair.stacks["b"]
        self.sent_before = forwarded(a)
        root = psutil.Process(b.proc.pid)
        procs = [root, *root.children(recursive=True)]
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                continue
            self.killed += 1
        psutil.wait_procs(procs, timeout=30)
        b.proc.wait(10)
        self.restart = threading.Thread(target=self._restart, daemon=True)
        self.restart.start()
        return f"site b: {self.killed} processes"

    def _restart(self) -> None:
        started = time.monotonic()
        try:
            self.pair.stacks["b"].start()
            self.restart_s = round(time.monotonic() - started, 1)
        except Exception as exc:  # noqa: BLE001 - reported with the fault
            self.error = f"{type(exc).__name__}: {str(exc)[-300:]}"

    def recovered(self) -> bool:
        """Whether site `b` is up again and answers a site probe on `a`'s path to it (`a` probes
        it every `sites.probe_s`). Changes nothing."""
        if self.restart is None or self.restart.is_alive() or self.restart_s is None:
            return False
        try:
            r = httpx.get(f"{self.pair.proxies[('a', 'b')].url}/baton/site", timeout=5,
                          headers={"x-baton-site-token": TOKEN})
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def report(self) -> dict:
        """How many processes died, how long `b`'s restart took, and what `a` had `b` serve before
        the kill and by the end of the traffic."""
        return {"site_processes_killed": self.killed, "site_restart_s": self.restart_s,
                "site_restart_error": self.error, "forwarded_before_kill": self.sent_before,
                "forwarded_at_end": forwarded(self.stack)}
