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
import random
import secrets
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from routing.prefix.redis_state import registry_key
from tests.cluster.local_cluster import API_KEY, GCS_PORT, POLL_S, PYTHON, REPO, LocalCluster, port_free

SCALE_TIMEOUT_S = 300
REPLICA_START_TIMEOUT_S = 420

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


# Module scope: one cluster for all the tests, stopped as soon as they are done
# (in `make test` the notebook tests, which start stacks of their own, follow).
@pytest.fixture(scope="module")
def cluster():
    if not port_free(GCS_PORT):
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

    def intrude(extra: dict) -> str:
        # A refused driver retries its GCS connection once a second, 20 times by default: 3 here,
        # for each driver alike, so the one with the right token shows that 3 are enough to get in.
        env = {**base, **extra, "HOME": str(home), "RAY_gcs_rpc_server_reconnect_timeout_s": "4",
               "RAY_gcs_server_port_wait_time_s": "3"}
        try:
            return subprocess.run([PYTHON, "-c", INTRUDER, cluster.address], cwd=REPO, env=env,
                                  capture_output=True, text=True, timeout=90).stdout
        except subprocess.TimeoutExpired:
            return "REFUSED (still waiting for the GCS after 90 s)"

    token = {"RAY_AUTH_MODE": "token"}
    attempts = {"no token": {}, "wrong token": {**token, "RAY_AUTH_TOKEN_PATH": str(wrong)},
                "the token": {**token, "RAY_AUTH_TOKEN_PATH": cluster.env["RAY_AUTH_TOKEN_PATH"]}}
    with ThreadPoolExecutor(len(attempts)) as pool:  # all wait out the GCS at once
        outs = dict(zip(attempts, pool.map(intrude, attempts.values())))
    for label, out in outs.items():
        print(f"Ray driver with {label}: {out.strip()[:200]}")
    assert "CONNECTED 1" in outs.pop("the token"), "the driver with the token must get in"
    for label, out in outs.items():
        assert "CONNECTED" not in out, f"{label}: a Ray driver got in:\n{out}"


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
            time.sleep(POLL_S)
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
        time.sleep(POLL_S)
    # The new prefill replica landed on a prefill node (the autoscaler added one:
    # each prefill node has `prefill: 1`), decode is where it was.
    state = cluster.probe()
    counts = _assert_placement(cluster, state)
    assert counts == {"prefill": 2, "decode": 1}, counts
    prefill_nodes = {r["node"] for r in _replicas(state, "prefill")}
    assert len(prefill_nodes) == 2, f"both prefill replicas on one node: {prefill_nodes}"
