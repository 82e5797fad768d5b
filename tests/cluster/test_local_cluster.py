"""The cluster flow on this machine: cluster/ray_up/local.yaml, `baton deploy`, teardown.

One cluster serves the whole file (a module-scoped fixture):

- `cluster/ray_up/scripts/local_up.sh` runs local.yaml's head_start_ray_commands
  here (Redis, the Mooncake master and a store, then `ray start --head` whose
  v1 autoscaler, with Ray's fake_multinode provider, launches one fake
  `prefill` and one fake `decode` node: extra raylets on this machine that
  advertise `prefill`/`decode` and `accelerator_type:H100`/`L4`). It stands
  in for `ray up`, which cannot read this provider's defaults from the PyPI
  wheel (see docs/deploy.md).
- `python -m cluster.deploy` deploys Baton onto it, with a test config: free
  loopback ports for Baton's services, `kv_cache_gb: 1`, the tiny default
  model, and the prefill pool autoscaled from 1 to 2 replicas.
- Teardown runs `local_up.sh --down` (the local stand-in for `ray down`) even
  when a test failed, and checks that nothing of the cluster is left.

Where replicas run is read without the dashboard (local.yaml starts the head
with `--include-dashboard=false`, and Ray's state API needs it): a probe
driver reads `ray.nodes()` and the GCS actor table (`ray._private.state`,
the same source `ray list actors` ends up at), whose entries carry each
actor's `Address.NodeID`, and `serve.status()` for the replica counts.
"""

from __future__ import annotations

import json
import os
import random
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

from cluster.stack_process import REPO, free_ports

LOCAL_UP = REPO / "cluster" / "ray_up" / "scripts" / "local_up.sh"
PYTHON = sys.executable
GCS_PORT = 6379  # local.yaml's `ray start --head --port`; the fake provider joins it there
DEPLOY_TIMEOUT_S = 420
SCALE_TIMEOUT_S = 300

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
        # Short: Ray's Unix sockets live under <node_dir>/ray/session_*/sockets (107-byte limit).
        self.node_dir = Path(tempfile.mkdtemp(prefix="bct-", dir="/tmp"))
        p = free_ports(8)
        self.serve_port = p[0]
        self.config = self.node_dir / "baton.yaml"
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
            "serve": {"port": p[0]},
            "redis": {"url": f"redis://127.0.0.1:{p[1]}/0"},
            "mooncake": {"global_segment_size": "512MB", "master_port": p[2], "metadata_port": p[3],
                         "master_metrics_port": p[4], "store_port": p[5], "store_http_port": p[6]},
            "routing": {"events_port": p[7]},
            "state_dir": str(self.node_dir / "state"),
            "ray": {"address": "auto"},
        }))
        self.env = {
            **os.environ,
            "BATON_NODE_DIR": str(self.node_dir),
            "BATON_NODE_IP": "127.0.0.1",     # Baton's services on loopback
            "BATON_CONFIG": str(self.config),
            "RAY_AUTH_MODE": "token",          # `ray start` enables token auth
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("RAY_ADDRESS", None)
        self.log = self.node_dir / "test.log"
        self.address: str | None = None

    def _run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        with open(self.log, "a") as out:
            out.write(f"\n$ {' '.join(argv)}\n")
            out.flush()
            return subprocess.run(argv, cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=timeout)

    def tail(self, n: int = 80) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def up(self) -> None:
        rc = self._run(["bash", str(LOCAL_UP)], timeout=180).returncode
        assert rc == 0, f"local_up.sh failed ({rc}):\n{self.tail()}"
        self.address = (self.node_dir / "ray" / "ray_current_cluster").read_text().strip()

    def wait_for_workers(self, timeout: float = 180) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            state = self.probe()
            kinds = [self.kind(n) for n in state["nodes"].values() if n["alive"]]
            if "prefill" in kinds and "decode" in kinds:
                return state
            assert time.monotonic() < deadline, f"fake worker nodes did not join: {state['nodes']}"
            time.sleep(5)

    def deploy(self) -> None:
        rc = self._run([PYTHON, "-m", "cluster.deploy", "--config", str(self.config),
                        "--address", self.address, "--head-ip", "127.0.0.1",
                        "--worker-config", str(self.node_dir / "mooncake.json"),
                        "--timeout", str(DEPLOY_TIMEOUT_S)], timeout=DEPLOY_TIMEOUT_S + 120).returncode
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

    def ray_processes(self) -> list[psutil.Process]:
        root = str(self.node_dir / "ray") + "/"
        found = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if root in " ".join(p.info["cmdline"] or []):
                    found.append(p)
            except psutil.Error:
                pass
        return found

    def down(self) -> None:
        """`local_up.sh --down`; asserts nothing of this cluster is left running."""
        pids = {}
        for name in ("redis", "mooncake-master", "mooncake-store"):
            f = self.node_dir / f"{name}.pid"
            if f.exists():
                pids[name] = int(f.read_text())
        rc = self._run(["bash", str(LOCAL_UP), "--down"], timeout=120).returncode
        time.sleep(1)
        left = [p.pid for p in self.ray_processes()]
        alive = [n for n, pid in pids.items() if psutil.pid_exists(pid)
                 and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        assert rc == 0 and not left and not alive, \
            f"--down left Ray pids {left}, daemons {alive} (rc {rc}):\n{self.tail()}"


# Module scope: one cluster for both tests, stopped as soon as they are done
# (in `make test` the notebook tests, which start stacks of their own, follow).
@pytest.fixture(scope="module")
def cluster():
    if not _port_free(GCS_PORT):
        pytest.skip(f"port {GCS_PORT} (local.yaml's GCS port) is taken by another process")
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make sysdeps)")
    c = LocalCluster()
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
        finally:
            if not failed:
                shutil.rmtree(c.node_dir, ignore_errors=True)
            else:
                print(f"cluster logs kept in {c.node_dir}", file=sys.stderr)


def _chat(port: int, content: str, max_tokens: int, timeout: float = 120) -> dict:
    body = json.dumps({"model": "baton-tiny", "max_tokens": max_tokens, "temperature": 0,
                       "messages": [{"role": "user", "content": content}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
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
    # The ingress and the indexer stay off the engine nodes (the indexer is pinned to the head).
    indexer = _replicas(state, "kv_indexer")
    assert indexer and all(cluster.kind(state["nodes"][r["node"]]) == "head" for r in indexer)

    reply = _chat(cluster.serve_port, "Say hello to the cluster.", max_tokens=8)
    assert reply["choices"][0]["message"]["content"], reply
    assert reply["usage"]["completion_tokens"] > 0


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

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(6)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + SCALE_TIMEOUT_S
    history = []
    try:
        while True:
            state = cluster.probe()
            deps = state["deployments"]
            history.append({n: d["replicas"] for n, d in deps.items() if n in ("prefill", "decode")})
            assert done[0] or len(errors) < 20, f"the load fails: {errors[-3:]}"
            # Decode is never scaled: one replica, no other state.
            assert deps["decode"]["replicas"] == {"RUNNING": 1}, history
            if deps["prefill"]["replicas"].get("RUNNING", 0) == 2:
                break
            assert time.monotonic() < deadline, \
                f"prefill did not reach 2 replicas in {SCALE_TIMEOUT_S}s ({done[0]} requests done, " \
                f"errors {errors[-3:]}): {history[-5:]}"
            time.sleep(5)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=200)
    assert done[0] > 0, errors[-3:]
    # The new prefill replica landed on a prefill node (the autoscaler added one:
    # each fake prefill node has `prefill: 1`), decode is where it was.
    state = cluster.probe()
    counts = _assert_placement(cluster, state)
    assert counts == {"prefill": 2, "decode": 1}, counts
    prefill_nodes = {r["node"] for r in _replicas(state, "prefill")}
    assert len(prefill_nodes) == 2, f"both prefill replicas on one node: {prefill_nodes}"
