"""A share of this machine's CPU time for one group of processes: a cgroup's CPU quota.

Two users:

- a pool's `resources.cpu_quota` caps each of its replicas, engine included
  (the replica `join`s its own slice before it starts the engine): replicas
  that share a node then each compute with their own share, as on machines
  of their own, and one busy replica cannot starve the others;
- `baton bench sites --local` runs three sites on one machine. Real sites
  have machines of their own; sharing two cores, a busy site slows the
  others, and sending work from a full site to an idle one moves CPU between
  them instead of adding any. A slice per site (its whole process tree,
  started through `prefix()`) emulates separate machines, as the delay
  proxies emulate distance.

A slice is a cgroup under the cgroup v1 `cpu` controller, or cgroup v2 where
its `cpu` controller is enabled. It needs root (or a delegated cgroup);
`available()` says whether this machine allows it. Processes join by being
started through `prefix()`, or by `join`ing; every process they fork after
that is in the slice too.
"""

from __future__ import annotations

import os
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup/cpu")
V2_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 20_000  # a short period: a throttled site waits at most this long for its next share


def _root() -> tuple[Path, int] | None:
    """The cgroup root with a CPU controller, and its version; None where there is none."""
    if (V1_ROOT / "cpu.cfs_quota_us").exists():
        return V1_ROOT, 1
    controllers = V2_ROOT / "cgroup.subtree_control"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return V2_ROOT, 2
    return None


def available() -> bool:
    """Whether this process may create CPU slices here (tried: a cgroup made and removed)."""
    found = _root()
    if found is None:
        return False
    probe = found[0] / f"baton-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


class CpuSlice:
    """One cgroup, created unlimited; `limit` sets its quota, `close` removes it.

    ``name`` must be unique among this machine's live slices (a bench's name and a site's).
    """

    def __init__(self, name: str) -> None:
        found = _root()
        if found is None:
            raise RuntimeError("no writable cgroup with a CPU controller on this machine (needs root)")
        root, self.version = found
        self.path = root / f"baton-{name}"
        self.path.mkdir(exist_ok=True)
        self.limit(None)

    def prefix(self) -> list[str]:
        """A command prefix that moves the command's process into this slice before it execs."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs")]

    def limit(self, cores: float | None) -> None:
        """Caps the slice's processes together at `cores` cores' worth of CPU time (None: no cap)."""
        if self.version == 1:
            quota = -1 if cores is None else max(1000, int(cores * PERIOD_US))
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            quota = "max" if cores is None else str(max(1000, int(cores * PERIOD_US)))
            (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")

    def throttled(self) -> dict:
        """The kernel's count of periods the slice ran out of quota, and for how long (cpu.stat)."""
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines() if line.strip())
        if self.version == 1:
            return {"periods": int(stat.get("nr_periods", 0)), "throttled": int(stat.get("nr_throttled", 0)),
                    "throttled_s": round(int(stat.get("throttled_time", 0)) / 1e9, 2)}
        return {"periods": int(stat.get("nr_periods", 0)), "throttled": int(stat.get("nr_throttled", 0)),
                "throttled_s": round(int(stat.get("throttled_usec", 0)) / 1e6, 2)}

    def join(self, pid: int | None = None) -> None:
        """Moves process `pid` (this one by default), every thread of it, into the slice."""
        (self.path / "cgroup.procs").write_text(str(pid or os.getpid()))

    def cap(self) -> float | None:
        """The slice's cap in cores, as the kernel has it (None: uncapped)."""
        if self.version == 1:
            quota = int((self.path / "cpu.cfs_quota_us").read_text())
            period = int((self.path / "cpu.cfs_period_us").read_text())
        else:
            q, p = (self.path / "cpu.max").read_text().split()
            quota, period = (-1 if q == "max" else int(q)), int(p)
        return None if quota < 0 else quota / period

    def pids(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the slice's live processes have used so far, from /proc: what
        they computed, whatever the quota. A process that already exited is not counted. Reads only."""
        total = 0
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # exited meanwhile
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        return round(total / os.sysconf("SC_CLK_TCK"), 2)

    def close(self) -> None:
        """Removes the slice. Processes still in it (none, once what it ran has stopped) go back to
        the root, uncapped; they are not signalled. Does nothing once removed."""
        if not self.path.exists():
            return
        for pid in self.pids():
            try:
                (self.path.parent / "cgroup.procs").write_text(str(pid))
            except OSError:
                pass  # exited meanwhile
        try:
            self.path.rmdir()
        except OSError:
            pass


def check(cfg, source: str) -> None:
    """Checks before anything starts that a pool asking for `resources.cpu_quota` can have it here.
    Raises ConfigError naming the field and the file."""
    from common.config import ConfigError

    for pool in ("prefill", "decode"):
        if getattr(cfg, pool).resources.cpu_quota is not None and not available():
            raise ConfigError(f"invalid config in {source}:\n  {pool}.resources.cpu_quota: this machine gives no "
                              "writable cgroup with a CPU controller (needs root or a delegated cgroup)")


def sweep(prefix: str) -> int:
    """Removes this machine's empty slices whose name starts with `prefix` (those a replica that
    was killed could not remove); returns how many."""
    found, removed = _root(), 0
    if found is None:
        return 0
    for path in found[0].glob(f"baton-{prefix}*"):
        try:
            path.rmdir()
            removed += 1
        except OSError:
            pass  # still has processes
    return removed
