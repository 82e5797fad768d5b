"""A prefix spilled by one Ray node's engine is loaded by another node's engine.

Two Ray nodes on this machine (`ray.cluster_utils.Cluster`: a head and a
worker raylet, each advertising its own custom resource), one real Mooncake
master and store, and one spill directory that both nodes mount (here the
same local path; on a cluster, a shared filesystem named as
`mooncake.spill_dir`). A prefill engine runs in an actor on node A and a
decode engine in an actor on node B.

Node A computes a prompt; its write-behind spills the prompt's KV. The
test then removes those keys from the memory pool, so only node A's spill
files hold the prefix. Node B's tier learns of the files from its own
background listing of the directory (no explicit refresh), and its engine
loads the whole prefix from them, with the same greedy tokens it computed
from scratch before.
"""

from __future__ import annotations

import os
import random
import time

import pytest
import ray
from ray.cluster_utils import Cluster

from bench.kv.kv_rig import KVRig, decode_on, prefill_on, rig_config, start_engine
from cluster import loopback
from common.config import BatonConfig

TOKENS = 650  # 20 full blocks of 32 tokens, and 10 more
BLOCKS = TOKENS // 32
LISTING_WAIT_S = 30


class EngineHost:
    """One vLLM engine with Baton's connector, on the Ray node the actor is placed on."""

    def __init__(self, cfg_json: str, role: str, mooncake_json: str):
        os.environ["MOONCAKE_CONFIG_PATH"] = mooncake_json
        self.cfg, self.role, self.engine = BatonConfig.model_validate_json(cfg_json), role, None

    async def start(self) -> str:
        """Starts the engine; returns this node's id."""
        self.engine = start_engine(self.cfg, self.role)
        return ray.get_runtime_context().get_node_id()

    async def prefill(self, prompt: list[int]) -> None:
        await prefill_on(self.engine, prompt)

    async def decode(self, prompt: list[int], max_tokens: int) -> tuple[list[int], int]:
        out = await decode_on(self.engine, prompt, max_tokens)
        return out.token_ids, out.cached_tokens

    async def spill_stats(self) -> dict:
        return (await self.engine.collective_rpc("spill_stats"))[0]

    async def reset_prefix_cache(self) -> None:
        await self.engine.reset_prefix_cache(reset_running_requests=False, reset_connector=False)

    def shutdown(self) -> None:
        self.engine.shutdown()


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("two-nodes")
    cfg = rig_config(workdir, kv_cache_gb=0.05, global_segment_size="64MB", spill_min_free="0")
    rig = KVRig(cfg, workdir)  # for its Mooncake master and store, and a client of the pool
    cluster = hosts = None
    with loopback.local_ray():  # every Ray server of both nodes on 127.0.0.1, for this module only
        try:
            mooncake_json = str(rig.start_store())
            node = {"num_cpus": 1, "node_ip_address": loopback.LOOPBACK, "include_dashboard": False}
            cluster = Cluster(initialize_head=True, head_node_args={**node, "resources": {"node_a": 1}})
            cluster.add_node(**node, resources={"node_b": 1})
            ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
            actor = ray.remote(EngineHost)
            env = {"env_vars": loopback.env()}  # the engines' Mooncake transfer engines bind loopback too
            hosts = [actor.options(num_cpus=0, resources={name: 1}, runtime_env=env)
                     .remote(cfg.model_dump_json(), role, mooncake_json)
                     for name, role in (("node_a", "prefill"), ("node_b", "decode"))]
            nodes = ray.get([h.start.remote() for h in hosts], timeout=600)
            yield rig, hosts, nodes
        finally:
            if hosts:
                ray.get([h.shutdown.remote() for h in hosts], timeout=120)
            if ray.is_initialized():
                ray.shutdown()
            if cluster is not None:
                cluster.shutdown()
            rig.close()


def test_a_prefix_spilled_on_one_node_loads_on_another(two_nodes):
    rig, (prefill, decode), (node_a, node_b) = two_nodes
    assert node_a != node_b
    prompt = [random.Random(7).randrange(2, 1000) for _ in range(TOKENS)]
    expected, cached = ray.get(decode.decode.remote(prompt, 8))  # node B computes it from scratch
    assert cached == 0
    ray.get(decode.reset_prefix_cache.remote())

    ray.get(prefill.prefill.remote(prompt))
    deadline = time.monotonic() + LISTING_WAIT_S
    while ray.get(prefill.spill_stats.remote()).get("pending", 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    files = rig.spill_files()
    assert len(files) == BLOCKS, files
    client = rig.store_client()
    for key in files.values():
        assert client.remove(key, True) == 0  # now only node A's spill files hold the prefix
    assert not any(e == 1 for e in client.batch_is_exist(list(files.values())))

    # Node B's tier lists the directory by itself every few seconds.
    deadline = time.monotonic() + LISTING_WAIT_S
    while ray.get(decode.spill_stats.remote()).get("tier_scan_added", 0) < BLOCKS:
        assert time.monotonic() < deadline, ray.get(decode.spill_stats.remote())
        time.sleep(0.2)

    tokens, cached = ray.get(decode.decode.remote(prompt, 8))
    stats = ray.get(decode.spill_stats.remote())
    assert cached == BLOCKS * 32
    assert stats.get("loaded_from_disk", 0) == BLOCKS and stats.get("tier_corrupt", 0) == 0
    assert tokens == expected
