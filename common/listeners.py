"""Which sockets a process tree listens on, and which of them face the network.

Used by `baton status --listeners` and the loopback test: a local stack
should listen on loopback only (docs/security.md).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

import psutil


def is_loopback(host: str) -> bool:
    """True for `localhost`, 127.0.0.0/8, ::1 and ::ffff:127.x; False for wildcards, interfaces and names."""
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


@dataclass(frozen=True)
class Listener:
    pid: int
    process: str
    proto: str  # "tcp" or "udp"
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        return is_loopback(self.address.split("%")[0])

    def __str__(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.proto} {host}:{self.port} pid {self.pid} ({self.process})"


def process_tree(roots: list[int]) -> list[psutil.Process]:
    """The processes in `roots` and all their descendants that are still alive."""
    found: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            for p in [root, *root.children(recursive=True)]:
                found[p.pid] = p
        except psutil.NoSuchProcess:
            continue
    return list(found.values())


def _command(p: psutil.Process) -> str:
    try:
        cmd = p.cmdline()
        return " ".join(cmd)[:80] if cmd else p.name()
    except psutil.Error:
        return "?"


def listeners(roots: list[int]) -> list[Listener]:
    """Every TCP socket in LISTEN and every bound UDP socket of the trees under `roots`."""
    out = []
    for p in process_tree(roots):
        try:
            conns = p.net_connections(kind="inet")
        except psutil.Error:
            continue
        for c in conns:
            tcp = c.type == socket.SOCK_STREAM
            if (tcp and c.status != psutil.CONN_LISTEN) or not c.laddr:
                continue
            if not tcp and c.raddr:  # a connected UDP socket only talks to its peer
                continue
            out.append(Listener(p.pid, _command(p), "tcp" if tcp else "udp", c.laddr.ip, c.laddr.port))
    return sorted(set(out), key=lambda x: (x.pid, x.port))


def exposed(roots: list[int]) -> list[Listener]:
    """The listeners of the trees under `roots` that are not on loopback."""
    return [x for x in listeners(roots) if not x.loopback]
