"""`LocalCluster`: one `ray up` cluster of cluster/ray_up/local.yaml on this machine, driven
by Ray's own CLI, for tests/cluster/test_local_cluster.py (whose docstring tells the flow)."""

from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

from cluster.ray_up import local_node
from cluster.ray_up.local_provider import cluster_dir
from common.constants import REPO_ROOT as REPO
from common.processes import free_ports
from deployments.api.api_keys import hash_key

LOCAL_YAML = REPO / "cluster" / "ray_up" / "local.yaml"
PYTHON = sys.executable
RAY = str(Path(sys.executable).parent / "ray")
GCS_PORT = 6379  # local.yaml's `ray start --head --port`
UP_TIMEOUT_S = 240
DEPLOY_TIMEOUT_S = 420
API_KEY = "cluster-test-key"  # the deploy config requires keys, as cluster/ray_up/baton/cluster.yaml does

# One Ray driver for every probe of a test run: it answers each line on its stdin with a line
# `PROBE_JSON {...}`. A new driver per probe (Python, Ray's and Serve's imports, a driver's
# connection) cost seconds of CPU each, every 5 s, beside the engines the tests wait for.
PROBE = r"""
import json, sys
import ray
from ray import serve
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
for _ in sys.stdin:
    nodes = {n["NodeID"]: {"alive": n["Alive"], "resources": n["Resources"]} for n in ray.nodes()}
    actors = [
        {"name": a["Name"], "state": a["State"], "node": a["Address"]["NodeID"]}
        for a in ray._private.state.state.actor_table(None).values()
        if a["Name"].startswith("SERVE_REPLICA::")
    ]
    app = serve.status().applications.get("baton")
    deps = {}
    if app is not None:
        deps = {n: {"status": d.status.value, "replicas": {k.value if hasattr(k, "value") else str(k): v
                                                        for k, v in d.replica_states.items()}}
                for n, d in app.deployments.items()}
    print("PROBE_JSON " + json.dumps({"nodes": nodes, "actors": actors, "deployments": deps}), flush=True)
"""
PROBE_TIMEOUT_S = 120
POLL_S = 2  # between probes while waiting: one costs the probe driver a few Ray and Serve reads


def port_free(port: int) -> bool:
    """Nothing listens on `port` (a bind test would also trip on TIME_WAIT)."""
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


class LocalCluster:
    def __init__(self) -> None:
        # Short: Ray's Unix sockets live under /tmp/baton-<name>/<node>/ray/session_*/sockets.
        self.name = f"bct{secrets.token_hex(3)}"
        self.dir = cluster_dir(yaml.safe_load(LOCAL_YAML.read_text())["provider"], self.name)
        self.work = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        p = free_ports(8)
        self.serve_port = p[0]
        self.config = self.work / "baton.yaml"
        self.config.write_text(yaml.safe_dump({
            "prefill": {
                "replicas": 1, "kv_cache_gb": 1,
                "resources": {"num_gpus": 0, "accelerator_type": "H100", "resources": {"prefill": 1}},
                "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1,
                                "upscale_delay_s": 2},
            },
            "decode": {
                "replicas": 1, "kv_cache_gb": 1,
                "resources": {"num_gpus": 0, "accelerator_type": "L4", "resources": {"decode": 1}},
            },
            "serve": {"port": p[0], "require_api_key": True, "api_keys": {hash_key(API_KEY): "tenant-a"}},
            "redis": {"url": f"redis://127.0.0.1:{p[1]}/0", "password_file": str(self.work / "redis_password")},
            "mooncake": {"global_segment_size": "512MB", "master_port": p[2], "metadata_port": p[3],
                         "master_metrics_port": p[4], "store_port": p[5], "store_http_port": p[6]},
            "routing": {"events_port": p[7]},
            "state_dir": str(self.work / "state"),
            "ray": {"address": "auto"},
        }))
        self.redis_port = p[1]
        token = self.work / "auth_token"
        token.write_text(secrets.token_hex(32))
        (self.work / "redis_password").write_text(secrets.token_hex(32))
        self.env = {
            **os.environ,
            "BATON_CONFIG": str(self.config),  # head_start.sh and the deploy read it
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),  # every node and driver of this cluster
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONUNBUFFERED": "1",
            # As Ray's own autoscaling test clusters (ray.cluster_utils) set it: the autoscaler on the
            # head sees a demand within 1 s, not 5 (the workers at `ray up`, the prefill node later).
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",
        }
        for var in ("RAY_ADDRESS", "RAY_TMPDIR", "RAY_UP_enable_autoscaler_v2"):
            self.env.pop(var, None)
        self.log = self.work / "test.log"
        self.address: str | None = None
        self.canary: subprocess.Popen | None = None
        self.prober: subprocess.Popen | None = None  # the probe driver (`probe`)
        self._probe_out = b""  # what it wrote that is not read yet

    def _run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        with open(self.log, "a") as out:
            out.write(f"\n$ {' '.join(argv)}\n")
            out.flush()
            return subprocess.run(argv, cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=timeout)

    def ray(self, *args: str, timeout: float) -> int:
        """`ray <command> ... -n <name> cluster/ray_up/local.yaml ...`."""
        return self._run([RAY, args[0], "-n", self.name, str(LOCAL_YAML), *args[1:]], timeout).returncode

    def tail(self, n: int = 80) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def start_canary(self) -> None:
        """A process named `raylet` outside the cluster: `ray stop` run
        machine-wide would kill it, a node-scoped one must not."""
        fake = self.work / "raylet"
        shutil.copy("/bin/sleep", fake)
        self.canary = subprocess.Popen([str(fake), "3600"], start_new_session=True)

    def up(self) -> None:
        rc = self.ray("up", "-y", "--no-config-cache", "--disable-usage-stats", timeout=UP_TIMEOUT_S)
        assert rc == 0, f"ray up failed ({rc}):\n{self.tail()}"
        out = subprocess.run([RAY, "get-head-ip", "-n", self.name, str(LOCAL_YAML)], cwd=REPO, env=self.env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        self.address = f"{out.stdout.strip().splitlines()[-1]}:{GCS_PORT}"

    def wait_for_workers(self, timeout: float = 240) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            state = self.probe()
            kinds = [self.kind(n) for n in state["nodes"].values() if n["alive"]]
            if "prefill" in kinds and "decode" in kinds:
                return state
            assert time.monotonic() < deadline, \
                f"the autoscaler did not bring up the worker nodes: {state['nodes']}\n{self.tail()}"
            time.sleep(POLL_S)

    def deploy(self) -> None:
        """`baton deploy` on the head, through `ray exec`, as on a cloud cluster."""
        cmd = ("python -m cluster.deploy --config $BATON_CONFIG --head-ip 127.0.0.1 "
               f"--worker-config $BATON_NODE_DIR/mooncake.json --timeout {DEPLOY_TIMEOUT_S}")
        rc = self.ray("exec", cmd, timeout=DEPLOY_TIMEOUT_S + 120)
        assert rc == 0, f"baton deploy failed ({rc}):\n{self.tail()}"

    def probe(self) -> dict:
        """The cluster's nodes, Serve's replica actors and its deployments' states, read by the
        probe driver (`PROBE`), which this starts on the first call (and again if it died)."""
        if self.prober is None or self.prober.poll() is not None:
            with open(self.work / "probe.err", "ab") as err:
                self.prober = subprocess.Popen([PYTHON, "-c", PROBE, self.address], cwd=REPO, env=self.env,
                                               bufsize=0, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
            self._probe_out = b""
        self.prober.stdin.write(b"\n")
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        fd = self.prober.stdout.fileno()
        while time.monotonic() < deadline:
            if b"\n" in self._probe_out:
                line, self._probe_out = self._probe_out.split(b"\n", 1)
                if line.startswith(b"PROBE_JSON "):
                    return json.loads(line.split(b" ", 1)[1])
                continue
            if not select.select([fd], [], [], deadline - time.monotonic())[0]:
                break
            chunk = os.read(fd, 1 << 16)
            if not chunk:  # the driver died
                break
            self._probe_out += chunk
        self.stop_probe()
        raise AssertionError(f"probe failed:\n{(self.work / 'probe.err').read_text(errors='replace')[-3000:]}")

    def stop_probe(self) -> None:
        """Ends the probe driver, if one runs (before `ray down`: it is a client of the cluster)."""
        if self.prober is not None:
            try:
                self.prober.stdin.close()
            except OSError:  # it died
                pass
            try:
                self.prober.wait(30)
            except subprocess.TimeoutExpired:
                self.prober.kill()
                self.prober.wait()
            self.prober = None

    @staticmethod
    def kind(node: dict) -> str:
        res = node["resources"]
        if "node:__internal_head__" in res:
            return "head"
        roles = [r for r in ("prefill", "decode") if res.get(r, 0) > 0]
        return roles[0] if len(roles) == 1 else f"other:{roles}"

    def node_dirs(self) -> list[str]:
        return [str(d) for d in self.dir.iterdir() if d.is_dir()] if self.dir.is_dir() else []

    def processes(self) -> dict[int, str]:
        """Every process of the cluster's nodes: pid -> command line."""
        found = {}
        for p in local_node.node_processes(self.node_dirs()):
            try:
                found[p.pid] = " ".join(p.cmdline())[:120]
            except psutil.Error:
                pass
        return found

    def down(self) -> None:
        """`ray down -y`; asserts that no process of the cluster is left and
        that the canary outside it survived."""
        self.stop_probe()
        before = self.processes()
        try:
            rc = self.ray("down", "-y", timeout=300)
        finally:
            left = {pid: cmd for pid, cmd in before.items() if psutil.pid_exists(pid)
                    and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE}
            left.update(self.processes())
            if left:  # never leak processes into the next tests
                local_node.power_off(self.node_dirs())
            canary_alive = self.canary is not None and self.canary.poll() is None
            if self.canary is not None:
                self.canary.kill()
                self.canary.wait()
        assert rc == 0 and not left, f"ray down left {left} (rc {rc}):\n{self.tail()}"
        assert canary_alive, "ray down stopped a `raylet` process outside the cluster"
        state = json.loads((self.dir / "nodes.json").read_text())
        assert all(n["state"] == "terminated" for n in state["nodes"].values()), state

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.work, ignore_errors=True)
        # `ray down` caches the resolved config in the temp dir (`ray up` was told not to).
        for f in Path(tempfile.gettempdir()).glob("ray-config-*"):
            try:
                if f'"cluster_name": "{self.name}"' in f.read_text():
                    f.unlink()
            except OSError:
                pass
