"""Child processes that `baton up` owns: started, watched and stopped by PID.

Each child runs in its own session so a Ctrl-C at the terminal reaches only
`baton up`, which then stops the children in reverse order of start. Output
goes to a log file per child under the state directory.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# Below the kernel's ephemeral range (where connect() takes its local ports) and above
# Ray's worker ports (10002-19999 by default).
_PORT_FLOOR = 20000


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default if unreadable)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(n: int, low: int = _PORT_FLOOR, high: int | None = None) -> list[int]:
    """n distinct TCP ports free on loopback right now, for servers that bind them later.

    They are drawn below the ephemeral range: a port the OS hands out for
    port 0 is an ephemeral one, and any outgoing connection (Ray's, Redis
    clients') may take it as its local port before the server binds it,
    which then fails with EADDRINUSE. Falls back to the OS's pick when the
    range below is too small or full. `low`..`high` (inclusive) narrows the draw.
    """
    rnd = random.SystemRandom()
    high = ephemeral_range()[0] - 1 if high is None else high
    ports: list[int] = []
    for _ in range(200 * n if high >= low else 0):
        if len(ports) == n:
            break
        port = rnd.randint(low, high)
        if port not in ports and _bindable(port):
            ports.append(port)
    socks = []
    while len(ports) < n:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        if s.getsockname()[1] not in ports:
            ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _bindable(port: int) -> bool:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); read its state so it counts as gone.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


@dataclass
class ManagedProcess:
    """One child: argv, environment, log file, and the port it serves."""

    name: str
    argv: list[str]
    log_path: Path
    ready_port: tuple[str, int] | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, environ: dict[str, str] | None = None) -> None:
        """Spawns the child in a process group of its own, with stdout/stderr to its log.

        Not in a session of its own: with the kernel's autogroup scheduling
        (on by default), each session is one scheduling group, and a small
        group (Redis, the Mooncake master or store) that wakes up while the
        launcher's group runs the engines waited 4 to 20 s for a CPU on a
        2-core VM (docs/architecture.md). In the launcher's session it competes
        per thread and runs within a time slice. A group of its own still
        keeps a terminal's Ctrl-C (sent to the foreground group) away from it.
        Its environment: `environ` (os.environ by default) and `self.env` over it."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        env = {**(os.environ if environ is None else environ), **self.env}
        self.proc = subprocess.Popen(
            self.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=self.cwd,
            process_group=0,
        )
        log.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float) -> None:
        """Blocks until the child's port accepts connections.

        Raises RuntimeError with the log's tail if the child exits or the
        port does not open in time.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited during start-up:\n{self.log_tail()}")
            if self.ready_port is None or port_open(*self.ready_port):
                return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not open {self.ready_port} in {timeout:.0f}s:\n{self.log_tail()}")

    def terminate(self) -> None:
        """SIGTERM, without waiting: children asked together exit side by side; stop() waits."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; reaps the child."""
        if not self.alive():
            return
        assert self.proc is not None
        self.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])


# Redis rewrites its append-only file once it has doubled since the last rewrite and holds at least
# this much. Redis's default, 64mb, let the indexer's churn (blocks stored, then removed) grow a file
# that a restart replayed for 6.2 s under 16 replicas' load, 0.62 s on a quiet VM, while every front's
# reads met LOADING (bench chaos, 16 timed replicas); rewritten, the same data loaded in 0.11 s.
AOF_REWRITE_MIN = "4mb"


def redis_argv(appendfsync: str = "off") -> list[str]:
    """redis-server's persistence arguments: no RDB snapshots; with `appendfsync` `everysec` or
    `always`, an append-only file in its `--dir`, loaded again when Redis restarts there, and kept
    compact (AOF_REWRITE_MIN)."""
    if appendfsync == "off":
        return ["--save", "", "--appendonly", "no"]
    return ["--save", "", "--appendonly", "yes", "--appendfsync", appendfsync,
            "--auto-aof-rewrite-percentage", "100", "--auto-aof-rewrite-min-size", AOF_REWRITE_MIN]


def redis_process(host: str, port: int, directory: Path, log_path: Path, appendfsync: str = "off") -> ManagedProcess:
    """A redis-server on host:port keeping its data in `directory` as `appendfsync` says
    (redis_argv; tests and benches keep nothing); not yet started."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("redis-server not installed (apt-get install redis-server)")
    argv = [binary, "--bind", host, "--port", str(port), *redis_argv(appendfsync), "--dir", str(directory)]
    return ManagedProcess("redis", argv, log_path, ready_port=(host, port))


@contextlib.contextmanager
def environ(overrides: dict[str, str]):
    """This process's environment with `overrides` set for the block (children started in it
    inherit them); afterwards each of those keys is as it was, set or unset."""
    saved = {key: os.environ.get(key) for key in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
