"""The processes of one node of a one-machine cluster, and how to stop only them.

A node of cluster/ray_up/local.yaml is a directory, `<cluster dir>/<node id>`,
plus the processes its commands started. The command runner
(local_runner.py) gives every command of the node the environment variable
`BATON_LOCAL_NODE=<node dir>`, and every process started from there (raylet,
GCS, Ray workers, the engines, Redis, Mooncake) inherits it. That marker
scopes stopping to one node: processes of other clusters, of other Ray
instances and of other users on this machine never carry it. A process that
overwrites its environment block for its process title still counts as the
node's when its parent does (Ray workers, children of the raylet), or when a
node script recorded it in a pid file in the node directory (Redis, started
detached by head_start.sh, which writes `$BATON_NODE_DIR/redis.pid`).

- `stop(node_dirs, ray_only=True)` is `ray stop` restricted to the nodes:
  Ray's own list of Ray process names (`RAY_PROCESSES`, which `ray stop`
  matches against every process on the machine), in `ray stop`'s order
  (raylet first, GCS last), among the nodes' processes only.
- `stop(node_dirs, ray_only=False)`: the same, then all the nodes' other
  processes.
- `power_off(node_dirs)` is what terminating a node means, as a cloud VM's
  shutdown does it: SIGTERM to every process of the nodes at once, SIGKILL to
  what is left after a short grace. Not `ray stop`'s buckets one after
  another: once the head's GCS is gone (`ray down` stops it first), a worker
  node's raylet and agents wait out their whole grace on SIGTERM, so each
  bucket would cost its full share.
- `python -m cluster.ray_up.local_node stop [-f] [-g S]` is what `ray stop`
  runs on a local node: scripts/local_bin/ray, first on the nodes' PATH,
  sends `ray stop` here and everything else to the real `ray`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import psutil

MARKER = "BATON_LOCAL_NODE"


def _own_lineage() -> set[int]:
    """This process and its ancestors (the shell running `ray stop`, ...)."""
    pids = {os.getpid()}
    try:
        pids.update(p.pid for p in psutil.Process().parents())
    except psutil.Error:
        pass
    return pids


def _recorded(node_dir: str) -> list[psutil.Process]:
    """Processes named by `<node_dir>/*.pid` that started before the file was
    written (a stale file whose pid was reused does not count)."""
    procs = []
    for pidfile in Path(node_dir).glob("*.pid"):
        try:
            proc = psutil.Process(int(pidfile.read_text().strip()))
            if proc.create_time() <= pidfile.stat().st_mtime + 1:
                procs.append(proc)
        except (OSError, ValueError, psutil.Error):
            continue
    return procs


def node_processes(node_dirs: Iterable[str]) -> list[psutil.Process]:
    """Live processes of the nodes in `node_dirs` (marked, or recorded in their
    pid files), with their descendants, without this process and its ancestors."""
    wanted = {os.path.abspath(d) for d in node_dirs}
    roots = [p for d in wanted for p in _recorded(d)]
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARKER) in wanted:
                roots.append(proc)
        except psutil.Error:  # gone, a zombie, or another user's
            continue
    found: dict[int, psutil.Process] = {}
    for proc in roots:
        found[proc.pid] = proc
        try:
            for child in proc.children(recursive=True):
                found[child.pid] = child
        except psutil.Error:
            continue
    for pid in _own_lineage():
        found.pop(pid, None)
    return [p for p in found.values() if _alive(p)]


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _ray_buckets() -> list[list[tuple[str, bool]]]:
    """Ray's process keywords in `ray stop`'s three buckets."""
    from ray.autoscaler._private.constants import RAY_PROCESSES

    keys = [(k, bool(by_name)) for k, by_name in RAY_PROCESSES]
    return [keys[:1], keys[1:-1], keys[-1:]]


def _matches(proc: psutil.Process, keywords: list[tuple[str, bool]]) -> bool:
    try:
        name, cmdline = proc.name(), subprocess.list2cmdline(proc.cmdline())
    except psutil.Error:
        return False
    return any(k in (name if by_name else cmdline) for k, by_name in keywords)


def _terminate(procs: list[psutil.Process], force: bool, grace_s: float) -> int:
    """SIGTERM (SIGKILL with `force`), then SIGKILL after `grace_s`. Returns
    how many had to be killed."""
    for p in procs:
        try:
            p.kill() if force else p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    if alive and not force:
        names = []
        for p in alive:
            try:
                names.append(f"{p.name()} ({p.pid})")
            except psutil.Error:
                pass
        print(f"after {grace_s:.1f} s, SIGKILL to {', '.join(names)}", file=sys.stderr)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=2)
    return len(alive)


def stop(node_dirs: Iterable[str], ray_only: bool = True, force: bool = False,
         grace_s: float = 16) -> int:
    """Stops the nodes' Ray processes (and with ray_only=False, then all their
    other processes). Returns the number of processes stopped."""
    node_dirs = list(node_dirs)
    # One snapshot, taken while the raylets still live: the agents and workers
    # they started rewrite their environment (setproctitle) and are only
    # known as the raylets' children.
    procs = node_processes(node_dirs)
    stopped = 0
    for bucket in _ray_buckets():
        matched = [p for p in procs if _alive(p) and _matches(p, bucket)]
        _terminate(matched, force, grace_s / 3)
        stopped += len(matched)
    if not ray_only:
        seen = {p.pid for p in procs}
        rest = [p for p in procs if _alive(p)] + [p for p in node_processes(node_dirs) if p.pid not in seen]
        _terminate(rest, force, grace_s / 2)
        stopped += len(rest)
    return stopped


def power_off(node_dirs: Iterable[str], grace_s: float = 5) -> int:
    """Stops every process of the nodes at once (SIGTERM, SIGKILL after `grace_s`), and any
    that was started meanwhile. Returns the number of processes stopped."""
    node_dirs = list(node_dirs)
    procs = node_processes(node_dirs)  # one snapshot while the raylets live (see `stop`)
    _terminate(procs, False, grace_s)
    seen = {p.pid for p in procs}
    late = [p for p in node_processes(node_dirs) if p.pid not in seen]
    _terminate(late, True, 0)
    return len(procs) + len(late)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ray stop (local node)", description=(
        "`ray stop` on a node of a one-machine cluster: stops this node's Ray "
        f"processes only (those carrying ${MARKER})."))
    p.add_argument("command", choices=["stop"])
    p.add_argument("-f", "--force", action="store_true", help="SIGKILL instead of SIGTERM")
    # Ray's 16 s, a third per bucket, gives processes with state worth flushing time to flush
    # it. A local node's Ray state goes with the node, and its GCS and agents may outlive any
    # grace on SIGTERM: 2 s a bucket (the test cluster's `ray down`: 26 s before, 23 s after).
    p.add_argument("-g", "--grace-period", type=float, default=6)
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.add_argument("--all", action="store_true", help="also the node's non-Ray processes")
    args, _ = p.parse_known_args(argv)  # ray stop's logging options are accepted and ignored
    node = os.environ.get(MARKER)
    if not node:
        print(f"local ray stop: ${MARKER} is not set: not on a local node; nothing stopped",
              file=sys.stderr)
        return 1
    n = stop([node], ray_only=not args.all, force=args.force, grace_s=args.grace_period)
    print(f"Stopped {n} process(es) of local node {node}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
