"""Runs `baton up` as a subprocess on free loopback ports.

Used by the e2e tests, the benchmarks and the notebooks. The stack is what
`make serve` starts, with its own state directory and ports, so it never
touches another running Baton. Stopping it sends SIGTERM to the `baton up`
PID it started and waits for everything to exit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from cluster import loopback
from common.constants import REPO_ROOT
from common.processes import free_ports

BATON = Path(sys.executable).parent / "baton"
READY_TIMEOUT_S = 600


def port_ready(host: str, port: int, proc: subprocess.Popen, timeout: float, path: str = "/health") -> None:
    """Waits until http://host:port{path} answers 200; raises if `proc` exits first."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {host}:{port} was ready")
        try:
            with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=2) as r:  # noqa: S310
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{host}:{port}{path} not ready in {timeout:.0f}s")


def bench_workdir(name: str) -> Path:
    """A fresh folder for one benchmark's stack configs and logs, under the
    default state dir, kept after the run for a look at the logs."""
    import shutil

    from common.config import load_config

    workdir = load_config(None, environ={}).state_path() / name
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    print(f"configs and logs in {workdir}", file=sys.stderr)
    return workdir


def write_config(workdir: Path, **overrides) -> Path:
    p = free_ports(8)
    cfg = {
        "state_dir": str(workdir / "state"),
        "serve": {"port": p[0]},
        "redis": {"url": f"redis://127.0.0.1:{p[1]}/0"},
        "mooncake": {"master_port": p[2], "metadata_port": p[3], "master_metrics_port": p[4],
                     "store_port": p[5], "store_http_port": p[6]},
        "tracing": {"exporter": "file", "file": str(workdir / "traces.jsonl")},
        "routing": {"events_port": p[7]},
    }
    for key, value in overrides.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "baton.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class StackProcess:
    def __init__(self, config: Path, prefix: list[str] | None = None):
        """`prefix`: a command that `baton up` is run under (common/cpu_slice.py's, say)."""
        self.config = config
        self.prefix = list(prefix or [])
        self.cfg = yaml.safe_load(config.read_text())
        self.url = f"http://127.0.0.1:{self.cfg['serve']['port']}"
        self.log = config.parent / "baton-up.log"
        self.proc: subprocess.Popen | None = None
        self.children: dict[str, int] = {}
        self._ready = False

    def baton(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(BATON), "--config", str(self.config), *args],
                              capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)

    def start(self) -> None:
        """Starts `baton up`; returns once it printed its ready line (`launch`, then `ready`)."""
        self.launch()
        self.ready()

    def launch(self) -> None:
        """Starts `baton up` and returns at once (`ready` waits for it), so that a caller can do
        other work while the stack starts."""
        out = open(self.log, "w")
        self.proc = subprocess.Popen([*self.prefix, str(BATON), "--config", str(self.config), "up"],
                                     stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=REPO_ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._ready = False

    def ready(self) -> None:
        """Returns once the launched stack printed its ready line, at once where it had. Stops it
        and raises if it exits first, is not ready in READY_TIMEOUT_S, or the wait is interrupted
        (Ctrl-C, or the SIGTERM a bench turns into one): a start given up on leaves nothing running."""
        if self._ready:
            return
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self._ready = True

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"baton up exited with {self.proc.returncode}:\n{self.tail()}")
            if "Baton is ready" in self.log.read_text(errors="replace"):
                self.children = self.state()["children"]
                return
            time.sleep(0.2)  # a test or bench waits on every start: 0.4 s a start saved over a 1 s poll
        raise TimeoutError(f"baton up not ready in {READY_TIMEOUT_S}s:\n{self.tail()}")

    def stop(self, timeout: float = 120) -> int | None:
        """SIGTERM to `baton up`, as Ctrl-C would; returns its exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)

    def state(self) -> dict:
        """`baton up`'s state.json as it is now: its children's current PIDs (restarted ones
        included), the Ray address, ..."""
        return json.loads((Path(self.cfg["state_dir"]) / "state.json").read_text())

    def driver(self, code: str, *args: str, timeout: float = 60) -> str:
        """Runs `code` as a Ray driver of this stack (`ray.init(address=sys.argv[1])` is up to
        it; `args` follow the address in sys.argv); returns its stdout, raises if it failed."""
        out = subprocess.run([sys.executable, "-c", code, self.state()["ray_address"], *args], timeout=timeout,
                             env={**os.environ, "RAY_AUTH_MODE": "token", **loopback.ray_env()},
                             capture_output=True, text=True, cwd=REPO_ROOT)
        if out.returncode != 0:
            raise RuntimeError(f"driver failed ({out.returncode}):\n{out.stderr[-3000:]}")
        return out.stdout

    def kill_replica(self, deployment: str, replica: str) -> None:
        """Kills one Serve replica actor of this stack (Serve will replace it)."""
        code = (
            "import ray, sys\n"
            "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
            "ray.kill(ray.get_actor(sys.argv[2], namespace='serve'), no_restart=True)\n"
        )
        self.driver(code, f"SERVE_REPLICA::baton#{deployment}#{replica}")

    def replica_processes(self, pool: str, replica: str) -> list:
        """One replica's processes, the replica's own first (it listens on the
        internal URL of its registry entry), then its vLLM EngineCore
        children; psutil.Process each, for replicas on this machine."""
        import psutil
        import redis

        from routing.prefix.redis_state import registry_key

        raw = redis.Redis.from_url(self.cfg["redis"]["url"]).hget(registry_key(pool), replica)
        host, port = json.loads(raw)["url"].rsplit("/", 1)[1].rsplit(":", 1)
        pid = next(c.pid for c in psutil.net_connections("tcp") if c.pid and c.status == psutil.CONN_LISTEN
                   and c.laddr.port == int(port) and c.laddr.ip == host.strip("[]"))
        proc = psutil.Process(pid)
        return [proc, *(c for c in proc.children(recursive=True) if "EngineCore" in " ".join(c.cmdline()))]

    def indexer_pid(self) -> int | None:
        """The KV indexer's process: the one listening on the events port, which the indexer binds
        as it starts; None while none does. A look at the sockets, not a Ray driver's seconds of CPU."""
        import psutil

        port = int(self.cfg["routing"]["events_port"])
        return next((c.pid for c in psutil.net_connections("tcp") if c.pid and c.status == psutil.CONN_LISTEN
                     and c.laddr.port == port), None)

    @staticmethod
    def crash(processes: list, timeout_s: float = 30) -> None:
        """SIGKILLs `processes` (a replica's, from replica_processes), in order,
        as a crash would, and returns once they are gone, their sockets closed.
        Serve starts a replacement once it sees the actor dead; the registry
        entry stays until it goes stale. (kill_replica asks Ray instead, and
        returns before the replica is gone.)"""
        import psutil

        def gone(p) -> bool:  # a zombie has closed its sockets already
            try:
                return p.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        for p in processes:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        deadline = time.monotonic() + timeout_s
        while not all(gone(p) for p in processes):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{processes} still running {timeout_s:.0f} s after SIGKILL")
            time.sleep(0.01)

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""
