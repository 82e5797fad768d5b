"""What `baton bench chaos` kills, and how it knows the component is back.

Each fault SIGKILLs one component of a running stack (bench/common/stack.py), as
a crash would:
- `decode` / `prefill`: one replica of that pool, its process and its vLLM
  engine core (a colocated replica is a `decode` one); Serve starts a
  replacement, back when the pool has as many live replicas as before;
- `engine`: the vLLM engine core of one decode (or colocated) replica, alone: the
  replica leaves the registry at once and its front forwards to the others
  (deployments/replica.py `_watch_engine`) until Serve replaces it at its health
  check; back as `decode` is;
- `indexer`: the KV indexer's process (the one on the events port); Serve starts
  another, back when a new process listens there;
- `redis`, `mooncake-master`, `mooncake-store`, and `ingress` (the first of
  HAProxy's processes, where `serve.ingress` runs it): the process `baton up` started; its supervision
  starts another, back when state.json names a new PID (HAProxy's accepting
  connections; Redis's answering a PING, which it refuses while it loads its file).

`<name>:freeze` (a replica, the indexer or a process above) stops it with SIGSTOP
instead, and SIGCONTs it `freeze_s` later, as a stalled machine or a long GC pause
would: nothing restarts it, and it is back once it answers again (a replica: its
heartbeat is fresh; the indexer: a process listens on the events port).
"""

from __future__ import annotations

import json
import socket
import threading
import time

import redis as redis_lib

from bench.common.stack import StackProcess
from routing.prefix.redis_state import registry_key

POOL_FAULTS = ("decode", "prefill")
CHILD_FAULTS = ("redis", "mooncake-master", "mooncake-store", "ingress")
ENGINE = "engine"  # a decode replica's engine core alone
REPLICA_FAULTS = (*POOL_FAULTS, ENGINE)  # what Serve replaces
FAULTS = (*REPLICA_FAULTS, "indexer", *CHILD_FAULTS)
FREEZES = tuple(f"{name}:freeze" for name in (*POOL_FAULTS, "indexer", *CHILD_FAULTS))

def _live(stack: StackProcess, pool: str) -> list[str]:
    timeout = stack.cfg["routing"].get("replica_timeout_s", 5)
    try:
        raw = redis_lib.Redis.from_url(stack.cfg["redis"]["url"], socket_timeout=2).hgetall(registry_key(pool))
    except redis_lib.RedisError:
        return []
    return sorted(k.decode() for k, v in raw.items() if time.time() - json.loads(v)["ts"] <= timeout)


def _pool(component: str) -> str:
    """The pool a replica fault hits: an engine fault's is decode."""
    return "decode" if component == ENGINE else component


def _children(stack: StackProcess) -> dict[str, int]:
    return stack.state()["children"]


def _crash(stack: StackProcess, pid: int) -> None:
    """SIGKILLs `pid` and returns once it is gone, its sockets closed (StackProcess.crash)."""
    import psutil

    try:
        stack.crash([psutil.Process(pid)])
    except psutil.NoSuchProcess:
        pass


def _accepts(url: str) -> bool:
    host, port = url.rsplit("//", 1)[-1].split("/")[0].rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1):
            return True
    except OSError:
        return False


def _answers(stack: StackProcess, component: str) -> bool:
    """Whether a restarted child serves: HAProxy accepts connections; Redis answers a PING, which it
    refuses (LOADING) until it has loaded its append-only file. True for the others."""
    if component == "ingress":
        return _accepts(stack.url)
    if component != "redis":
        return True
    try:
        with redis_lib.Redis.from_url(stack.cfg["redis"]["url"], socket_timeout=1, socket_connect_timeout=1) as r:
            return bool(r.ping())
    except redis_lib.RedisError:
        return False


def _child_name(stack: StackProcess, fault: str) -> str:
    return next(n for n in _children(stack) if fault in n)


class Fault:
    """One kill (or freeze) of one component; `recovered()` polls whether it is back."""

    def __init__(self, stack: StackProcess, name: str, freeze_s: float = 10.0):
        if name not in FAULTS and name not in FREEZES:
            raise ValueError(f"unknown fault {name!r}: one of {FAULTS + FREEZES}")
        self.stack, self.name = stack, name
        self.component, _, mode = name.partition(":")
        self.freeze_s = freeze_s if mode == "freeze" else None
        self.before: object = None
        self._resumed = threading.Event()

    def applies(self) -> bool:
        """Whether this stack has the component (a colocated stack has no prefill pool)."""
        if self.component in REPLICA_FAULTS:
            return bool(_live(self.stack, _pool(self.component)))
        if self.component in CHILD_FAULTS:
            return any(self.component in name for name in _children(self.stack))
        return True

    def prepare(self) -> None:
        """Sets up what the fault needs before the traffic starts: nothing here (bench/chaos/swap.py
        has a model to make resident)."""

    def report(self) -> dict:
        """What the fault adds to its record: nothing here."""
        return {}

    def inject(self) -> str:
        """Kills (or freezes) the component; returns what was hit. Changes the stack."""
        s, c = self.stack, self.component
        if self.freeze_s is not None:
            return self._freeze()
        if c in REPLICA_FAULTS:
            self.before = _live(s, _pool(c))
            victim = self.before[0]
            processes = s.replica_processes(_pool(c), victim)  # the replica's own process first
            if c == ENGINE:
                if len(processes) < 2:
                    raise RuntimeError(f"replica {victim} has no engine core process on this machine")
                processes = processes[1:]
            s.crash(processes)
            return victim
        if c == "indexer":  # as a crash would: Serve sees its replica die and starts another
            self.before = s.indexer_pid()
            if self.before is None:
                return "none"
            _crash(s, self.before)
            return f"kv_indexer pid {self.before}"
        name = _child_name(s, c)
        self.before = _children(s)[name]
        _crash(s, self.before)
        return f"{name} pid {self.before}"

    def _freeze(self) -> str:
        """SIGSTOPs the component's processes (a replica's whole tree); a timer SIGCONTs them."""
        import psutil

        s, c = self.stack, self.component
        if c in POOL_FAULTS:
            victim = _live(s, c)[0]
            root = s.replica_processes(c, victim)[0]
            self.before = victim
        elif c == "indexer":
            victim = self.before = "kv_indexer"
            pid = s.indexer_pid()
            if pid is None:  # psutil.Process(None) would be this process
                raise RuntimeError("no KV indexer listens on the events port")
            root = psutil.Process(pid)
        else:
            victim = _child_name(s, c)
            root = psutil.Process(_children(s)[victim])
            self.before = root.pid
        procs = [root, *root.children(recursive=True)]
        for p in procs:
            p.suspend()

        def resume() -> None:
            for p in procs:
                try:
                    p.resume()
                except psutil.Error:
                    pass
            self._resumed.set()

        threading.Timer(self.freeze_s, resume).start()
        return f"{victim} frozen {self.freeze_s:.0f} s"

    def recovered(self) -> bool:
        """Whether the component is back (see the module docstring); changes nothing."""
        s, c = self.stack, self.component
        try:
            if self.freeze_s is not None:
                if not self._resumed.is_set():
                    return False
                if c in POOL_FAULTS:
                    return self.before in _live(s, c)
                if c == "indexer":
                    return s.indexer_pid() is not None
                return _answers(s, c)
            if c in REPLICA_FAULTS:
                live = _live(s, _pool(c))
                return len(live) >= len(self.before) and live != self.before
            if c == "indexer":
                now = s.indexer_pid()
                return now is not None and now != self.before
            name = _child_name(s, c)
            pid = _children(s)[name]
            return pid != self.before and _answers(s, c)
        except (OSError, RuntimeError, ValueError, StopIteration, KeyError):
            return False
