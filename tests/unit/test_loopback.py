"""The bind shim (cluster/loopback/bind_loopback.c) and the listener classification."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from cluster import loopback
from common.listeners import Listener, listeners

PROBE = r"""
import json, socket, sys
out = {}
def bound(family, addr, v6only=None):
    s = socket.socket(family)
    if v6only is not None:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
    s.bind(addr)
    return s.getsockname()[0]
out["v4_any"] = bound(socket.AF_INET, ("0.0.0.0", 0))
out["v6_any"] = bound(socket.AF_INET6, ("::", 0))
out["v6_only"] = bound(socket.AF_INET6, ("::", 0), 1)
out["explicit"] = bound(socket.AF_INET, ("127.0.0.2", 0))
out["exempt"] = bound(socket.AF_INET, ("0.0.0.0", int(sys.argv[1])))
print(json.dumps(out))
"""


def _probe(extra_env: dict[str, str], port: int) -> dict:
    env = {**os.environ, **extra_env}
    out = subprocess.run([sys.executable, "-c", PROBE, str(port)], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def shim_env():
    try:
        return loopback.env()
    except RuntimeError as exc:  # no C compiler: `make install` puts one there
        pytest.fail(str(exc))


def test_wildcards_land_on_loopback_and_the_rest_is_untouched(shim_env):
    port = _free_port()
    got = _probe({**shim_env, "BATON_BIND_EXEMPT_PORTS": f"1,{port}"}, port)
    assert got == {"v4_any": "127.0.0.1", "v6_any": "::ffff:127.0.0.1", "v6_only": "::1",
                   "explicit": "127.0.0.2", "exempt": "0.0.0.0"}


def test_wildcards_land_on_the_configured_address(shim_env):
    got = _probe({**shim_env, "BATON_BIND_ADDRESS": "127.0.0.3"}, _free_port())
    assert got["v4_any"] == "127.0.0.3" and got["v6_any"] == "::ffff:127.0.0.3"
    assert got["exempt"] == "127.0.0.3"  # no exemption asked for


def test_env_makes_mooncake_and_vllm_advertise_loopback(shim_env):
    assert shim_env["LD_PRELOAD"].split()[0] == str(loopback.library_path())
    assert shim_env["MC_TCP_BIND_ADDRESS"] == shim_env["VLLM_HOST_IP"] == "127.0.0.1"
    assert loopback.env((8000, 8001))["BATON_BIND_EXEMPT_PORTS"] == "8000,8001"


@pytest.mark.parametrize("address,expected", [
    ("127.0.0.1", True), ("127.5.0.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("::ffff:10.0.0.5", False), ("fe80::1%eth0", False),
])
def test_listener_loopback(address, expected):
    assert Listener(1, "x", "tcp", address, 80).loopback is expected


def test_listeners_finds_this_process_sockets():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        found = listeners([os.getpid()])
    assert any(x.port == port and x.loopback and x.pid == os.getpid() for x in found)


def test_is_loopback_takes_names_too():
    from common.listeners import is_loopback

    assert is_loopback("localhost") and is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")
