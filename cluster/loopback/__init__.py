"""Keeps every listener of the local stack on loopback.

`baton up` (the embedded local stack, `make serve`, the test stacks) starts
its own Ray, Mooncake and engines on one machine, and nothing of it should
be reachable from another. Most components take a bind address and Baton
gives them 127.0.0.1; the rest need one of two things:

- Ray binds its node IP, so Ray runs in its one-machine mode
  (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0), whose node IP is 127.0.0.1.
- Mooncake (the master's metadata and admin servers, the store's RPC, TCP
  transport and HTTP server, and the same transfer engine inside every vLLM
  worker) binds wildcards with no option to change it. A small LD_PRELOAD
  shim (bind_loopback.c) pins a bind to 0.0.0.0 or :: to loopback in the
  processes that get `env()`; MC_TCP_BIND_ADDRESS and VLLM_HOST_IP make
  them advertise 127.0.0.1 too.

The shim is built with the system C compiler into the venv (`make install`
does it; `build()` does it on first use otherwise).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from common.processes import environ

SOURCE = Path(__file__).with_name("bind_loopback.c")
LOOPBACK = "127.0.0.1"


def library_path() -> Path:
    return Path(sys.prefix) / "lib" / "baton" / "libbaton_bind_loopback.so"


def build() -> Path:
    """Compiles the shim into the venv unless an up-to-date build is there; returns its path."""
    lib = library_path()
    if lib.exists() and lib.stat().st_mtime >= SOURCE.stat().st_mtime:
        return lib
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler to build the loopback shim (cluster/loopback/bind_loopback.c); "
                           "install gcc (`make install` does)")
    lib.parent.mkdir(parents=True, exist_ok=True)
    tmp = lib.with_suffix(f".{os.getpid()}.tmp")
    out = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(tmp), str(SOURCE), "-ldl"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"building the loopback shim failed:\n{out.stderr[-2000:]}")
    tmp.replace(lib)
    return lib


def ray_env() -> dict[str, str]:
    """Environment that puts a Ray head started here, and all its processes, on 127.0.0.1."""
    return {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def use_local_ray() -> None:
    """Makes this process (and its children) start or join Ray in its one-machine mode.

    Needed by every driver of a local stack's Ray (`baton up`, `baton status`):
    outside that mode Ray rewrites 127.0.0.1 to the machine's address. Ray
    reads the variable when imported, which may have happened already.
    """
    os.environ.update(ray_env())
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


@contextlib.contextmanager
def local_ray():
    """`use_local_ray` for the block only: afterwards this process's environment and Ray's cluster
    switch are as they were (a test module that starts its own one-machine Ray must not leave a
    later module's multi-node `ray up` in that mode)."""
    from ray._private import ray_constants

    saved_switch = ray_constants.ENABLE_RAY_CLUSTER
    with environ(ray_env()):
        use_local_ray()
        try:
            yield
        finally:
            ray_constants.ENABLE_RAY_CLUSTER = saved_switch


def env(exempt_ports: tuple[int, ...] = ()) -> dict[str, str]:
    """Environment for processes whose wildcard binds must land on loopback.

    `exempt_ports` keep their wildcard (the public port, when the config asks
    for every interface).
    """
    preload = [str(build())] + [p for p in os.environ.get("LD_PRELOAD", "").split() if p]
    return {
        "LD_PRELOAD": " ".join(dict.fromkeys(preload)),
        "BATON_BIND_EXEMPT_PORTS": ",".join(str(p) for p in exempt_ports),
        "MC_TCP_BIND_ADDRESS": LOOPBACK,
        "VLLM_HOST_IP": LOOPBACK,
        **ray_env(),
    }
