"""The cluster flow on this machine: `ray up` cluster/ray_up/local.yaml, `baton deploy`, `ray down`.

One cluster serves the whole file (a module-scoped fixture), driven by Ray's
own CLI (`.venv/bin/ray`, non-interactive):

- `ray up -y -n <unique name> cluster/ray_up/local.yaml` brings up the head
  (Redis, the Mooncake master and a store, then `ray start --head`) through
  Baton's one-machine node provider (cluster/ray_up/local_provider.py: nodes
  are processes here, commands run without SSH), and returns; Ray's
  autoscaler on the head then launches one `prefill` and one `decode` worker
  node (raylets that advertise `prefill`/`decode` and
  `accelerator_type:H100`/`L4`).
- `ray exec ... 'python -m cluster.deploy ...'` deploys Baton from the head,
  as on a cloud cluster, with a test config: free loopback ports for Baton's
  services, `kv_cache_gb: 1`, the tiny default model, and the prefill pool
  autoscaled from 1 to 2 replicas.
- Teardown runs `ray down -y` even when a test failed, and checks by PID that
  every process of the cluster is gone and that a process named `raylet`
  outside it (what a machine-wide `ray stop` would kill) is still running.

The cluster uses its own Ray auth token (RAY_AUTH_TOKEN_PATH), so it needs
nothing from ~/.ray. Where replicas run is read without the dashboard
(local.yaml starts the head with `--include-dashboard=false`, and Ray's state
API needs it): a probe driver reads `ray.nodes()` and the GCS actor table
(`ray._private.state`, the same source `ray list actors` ends up at), whose
entries carry each actor's `Address.NodeID`, and `serve.status()` for the
replica counts.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import yaml

from cluster.ray_up import local_node
from cluster.ray_up.local_provider import cluster_dir
from common.constants import REPO_ROOT as REPO
from common.processes import free_ports
from deployments.api_keys import hash_key
from routing.redis_state import registry_key

LOCAL_YAML = REPO / "cluster" / "ray_up" / "local.yaml"
PYTHON = sys.executable
RAY = str(Path(sys.executable).parent / "ray")
GCS_PORT = 6379  # local.yaml's `ray start --head --port`
UP_TIMEOUT_S = 240
DEPLOY_TIMEOUT_S = 420
SCALE_TIMEOUT_S = 300
REPLICA_START_TIMEOUT_S = 420
API_KEY = "cluster-test-key"  # the deploy config requires keys, as cluster/ray_up/baton/cluster.yaml does

# A Ray driver that reports whether it got in; run without the cluster's token.
INTRUDER = r"""
import sys
import ray
try:
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    print("CONNECTED", ray.get(ray.remote(lambda: 1).remote()), flush=True)
except Exception as exc:
    print("REFUSED", type(exc).__name__, str(exc)[:300], flush=True)
"""

PROBE = r"""
import json, sys
import ray
from ray import serve
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
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
print("PROBE_JSON " + json.dumps({"nodes": nodes, "actors": actors, "deployments": deps}))
"""


def _port_free(port: int) -> bool:
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
                "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1},
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
        }
        for var in ("RAY_ADDRESS", "RAY_TMPDIR", "RAY_UP_enable_autoscaler_v2"):
            self.env.pop(var, None)
        self.log = self.work / "test.log"
        self.address: str | None = None
        self.canary: subprocess.Popen | None = None

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
            time.sleep(5)

    def deploy(self) -> None:
        """`baton deploy` on the head, through `ray exec`, as on a cloud cluster."""
        cmd = ("python -m cluster.deploy --config $BATON_CONFIG --head-ip 127.0.0.1 "
               f"--worker-config $BATON_NODE_DIR/mooncake.json --timeout {DEPLOY_TIMEOUT_S}")
        rc = self.ray("exec", cmd, timeout=DEPLOY_TIMEOUT_S + 120)
        assert rc == 0, f"baton deploy failed ({rc}):\n{self.tail()}"

    def probe(self) -> dict:
        out = subprocess.run([PYTHON, "-c", PROBE, self.address], cwd=REPO, env=self.env,
                             capture_output=True, text=True, timeout=120)
        line = next((l for l in out.stdout.splitlines() if l.startswith("PROBE_JSON ")), None)
        assert line, f"probe failed ({out.returncode}):\n{out.stderr[-3000:]}"
        return json.loads(line.split(" ", 1)[1])

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
        before = self.processes()
        try:
            rc = self.ray("down", "-y", timeout=300)
        finally:
            left = {pid: cmd for pid, cmd in before.items() if psutil.pid_exists(pid)
                    and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE}
            left.update(self.processes())
            if left:  # never leak processes into the next tests
                local_node.stop(self.node_dirs(), ray_only=False, grace_s=5)
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


# Module scope: one cluster for both tests, stopped as soon as they are done
# (in `make test` the notebook tests, which start stacks of their own, follow).
@pytest.fixture(scope="module")
def cluster():
    if not _port_free(GCS_PORT):
        pytest.skip(f"port {GCS_PORT} (local.yaml's GCS port) is taken by another process")
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make sysdeps)")
    c = LocalCluster()
    c.start_canary()
    failed = False
    try:
        c.up()
        c.wait_for_workers()
        c.deploy()
        yield c
    except BaseException:
        failed = True
        raise
    finally:
        try:
            c.down()
        except BaseException:
            failed = True
            raise
        finally:
            if not failed:
                c.cleanup()
            else:
                print(f"cluster logs kept in {c.dir} and {c.work}", file=sys.stderr)


def _chat(port: int, content: str, max_tokens: int, timeout: float = 120) -> dict:
    body = json.dumps({"model": "baton-tiny", "max_tokens": max_tokens, "temperature": 0,
                       "messages": [{"role": "user", "content": content}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - loopback
        return json.loads(r.read())


def _replicas(state: dict, deployment: str) -> list[dict]:
    return [a for a in state["actors"]
            if a["state"] == "ALIVE" and a["name"].startswith(f"SERVE_REPLICA::baton#{deployment}#")]


def _assert_placement(c: LocalCluster, state: dict) -> dict[str, int]:
    nodes = state["nodes"]
    counts = {}
    for role in ("prefill", "decode"):
        reps = _replicas(state, role)
        assert reps, f"no live {role} replica: {state['actors']}"
        for r in reps:
            assert c.kind(nodes[r["node"]]) == role, \
                f"{r['name']} runs on a {c.kind(nodes[r['node']])} node {nodes[r['node']]}"
        counts[role] = len(reps)
    return counts


def test_placement_and_chat(cluster):
    state = cluster.probe()
    alive = [cluster.kind(n) for n in state["nodes"].values() if n["alive"]]
    assert alive.count("head") == 1 and "prefill" in alive and "decode" in alive, alive
    assert _assert_placement(cluster, state) == {"prefill": 1, "decode": 1}
    # The indexer stays off the engine nodes: it is pinned to the head.
    indexer = _replicas(state, "kv_indexer")
    assert indexer and all(cluster.kind(state["nodes"][r["node"]]) == "head" for r in indexer)

    reply = _chat(cluster.serve_port, "Say hello to the cluster.", max_tokens=8)
    assert reply["choices"][0]["message"]["content"], reply
    assert reply["usage"]["completion_tokens"] > 0


def test_unauthenticated_clients_are_refused(cluster):
    """Ray without the cluster's token and Redis without its password get nothing;
    the same clients with them (the probe, the deploy, the replicas) work."""
    import redis

    bare = redis.Redis(host="127.0.0.1", port=cluster.redis_port, socket_timeout=5)
    with pytest.raises(redis.AuthenticationError):
        bare.ping()
    bare.close()
    authed = redis.Redis(host="127.0.0.1", port=cluster.redis_port, socket_timeout=5,
                         password=(cluster.work / "redis_password").read_text().strip())
    assert authed.ping() and authed.hlen(registry_key("decode")) >= 1
    authed.close()

    wrong = cluster.work / "wrong_token"
    wrong.write_text(secrets.token_hex(32))
    home = cluster.work / "intruder-home"  # no ~/.ray/auth_token to fall back on
    home.mkdir(exist_ok=True)
    base = {k: v for k, v in cluster.env.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")}
    for label, extra in (("no token", {}), ("wrong token", {"RAY_AUTH_MODE": "token",
                                                            "RAY_AUTH_TOKEN_PATH": str(wrong)})):
        env = {**base, **extra, "HOME": str(home), "RAY_gcs_rpc_server_reconnect_timeout_s": "10"}
        try:
            out = subprocess.run([PYTHON, "-c", INTRUDER, cluster.address], cwd=REPO, env=env,
                                 capture_output=True, text=True, timeout=90).stdout
        except subprocess.TimeoutExpired:
            out = "REFUSED (still waiting for the GCS after 90 s)"
        assert "CONNECTED" not in out, f"{label}: a Ray driver got in:\n{out}"
        print(f"Ray driver with {label}: {out.strip()[:200]}")
    assert cluster.probe()["nodes"], "the driver with the token must still get in"


def test_prefill_autoscales_decode_untouched(cluster):
    stop = threading.Event()
    errors: list[str] = []
    done = [0]
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda sigma omega".split()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            # Long and unique: no prefix hits, so every request goes through the prefill pool.
            prompt = " ".join(rng.choice(words) for _ in range(300))
            try:
                _chat(cluster.serve_port, prompt, max_tokens=2, timeout=180)
                done[0] += 1
            except Exception as exc:  # noqa: BLE001 - reported if nothing scales
                errors.append(repr(exc))
                time.sleep(1)

    def watch(state: dict, history: list) -> dict:
        deps = state["deployments"]
        history.append({n: d["replicas"] for n, d in deps.items() if n in ("prefill", "decode")})
        # Decode is never scaled: one replica, no other state.
        assert deps["decode"]["replicas"] == {"RUNNING": 1}, history
        return deps["prefill"]["replicas"]

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(6)]
    for t in threads:
        t.start()
    history: list = []
    # 1. The load makes Serve ask for a second prefill replica.
    deadline = time.monotonic() + SCALE_TIMEOUT_S
    try:
        while sum(watch(cluster.probe(), history).values()) < 2:
            assert done[0] or len(errors) < 20, f"the load fails: {errors[-3:]}"
            assert time.monotonic() < deadline, \
                f"Serve did not scale prefill to 2 replicas in {SCALE_TIMEOUT_S}s ({done[0]} requests " \
                f"done, errors {errors[-3:]}): {history[-5:]}"
            time.sleep(5)
    finally:
        # The decision is made (Serve scales down only after downscale_delay_s,
        # 600 s by default): the engine of the new replica starts on 2 shared
        # cores faster without the load.
        stop.set()
        for t in threads:
            t.join(timeout=200)
    assert done[0] > 0, errors[-3:]
    # 2. Its pending `prefill: 1` demand makes the autoscaler add a prefill
    #    node, where the replica starts.
    deadline = time.monotonic() + REPLICA_START_TIMEOUT_S
    while watch(cluster.probe(), history).get("RUNNING", 0) < 2:
        assert time.monotonic() < deadline, \
            f"the second prefill replica is not RUNNING after {REPLICA_START_TIMEOUT_S}s: {history[-5:]}"
        time.sleep(5)
    # The new prefill replica landed on a prefill node (the autoscaler added one:
    # each prefill node has `prefill: 1`), decode is where it was.
    state = cluster.probe()
    counts = _assert_placement(cluster, state)
    assert counts == {"prefill": 2, "decode": 1}, counts
    prefill_nodes = {r["node"] for r in _replicas(state, "prefill")}
    assert len(prefill_nodes) == 2, f"both prefill replicas on one node: {prefill_nodes}"
