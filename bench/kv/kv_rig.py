"""A prefill/decode engine pair on a real Mooncake master and store, in one process.

The spill-tier tests and `baton bench kv` need what the serving stack hides:
the engines' spill counters, local prefix-cache resets, and a Mooncake client
to see which keys the memory pool still holds. `KVRig` starts the master and
the store (kvstore/mooncake.py), two vLLM AsyncLLM engines with
BatonStoreConnector (prefill = kv_producer, decode = kv_consumer), and stops
everything it started on `close()`. All engine calls are coroutines on one
event loop.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from actors import engine_args
from actors.vllm_plugin import FORK_ENV
from cluster import loopback
from common.config import BatonConfig
from common.engine_threads import thread_env
from common.processes import environ, free_ports
from kvstore import mooncake
from kvstore.spill import read_key, walk_objects


def _pair_env():
    """This process's environment while the pair's engine processes start (restored after): the
    cores split between the two engines and forked workers, as a stack's engines have
    (deployments/app.py)."""
    return environ({**thread_env(2, os.cpu_count() or 1), FORK_ENV: "1"})


@dataclass
class Decoded:
    token_ids: list[int]
    cached_tokens: int
    ttft_s: float


def rig_config(workdir: Path, kv_cache_gb: float, model: Path | None = None, **mooncake) -> BatonConfig:
    """A config for a rig in `workdir`: free loopback ports for Mooncake, the
    spill tier in `workdir/spill`, `mooncake` fields overriding the defaults."""
    p = free_ports(5)
    ports = dict(zip(("master_port", "metadata_port", "master_metrics_port", "store_port",
                      "store_http_port"), p))
    data = {
        "mooncake": {**ports, "spill_dir": str(Path(workdir) / "spill"), **mooncake},
        "prefill": {"kv_cache_gb": kv_cache_gb}, "decode": {"kv_cache_gb": kv_cache_gb},
        "state_dir": str(workdir),
    }
    if model is not None:
        data["model"] = {"path": str(model)}
    return BatonConfig.model_validate(data)


def start_engine(cfg: BatonConfig, role: str):
    """An AsyncLLM for `role` with Baton's connector and the KV probe (MOONCAKE_CONFIG_PATH must be set)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    args = engine_args.build(cfg, role)
    args.worker_extension_cls = "actors.kv_probe.KVProbeExtension"
    return AsyncLLM.from_engine_args(args)


async def prefill_on(engine, prompt: list[int]) -> None:
    """Computes `prompt` on a producer engine and waits until its KV is in the pool."""
    from vllm import SamplingParams

    rid = f"p-{uuid.uuid4().hex[:12]}"
    async for _ in engine.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=1, temperature=0), rid):
        pass
    while any(await engine.collective_rpc("pending_kv_saves", args=(rid,))):
        await asyncio.sleep(0.01)


async def decode_on(engine, prompt: list[int], max_tokens: int = 8) -> Decoded:
    """Greedy generation; cached tokens include those loaded from the store."""
    from vllm import SamplingParams

    t0 = time.perf_counter()
    ttft = None
    final = None
    async for out in engine.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=max_tokens, temperature=0),
                                     f"d-{uuid.uuid4().hex[:12]}"):
        ttft = ttft if ttft is not None else time.perf_counter() - t0
        final = out
    return Decoded(list(final.outputs[0].token_ids), final.num_cached_tokens or 0, ttft or 0.0)


class KVRig:
    def __init__(self, cfg: BatonConfig, workdir: Path):
        self.cfg = cfg
        self.workdir = Path(workdir)
        self.procs = [mooncake.master_process(cfg.mooncake, self.workdir / "logs"),
                      mooncake.store_process(cfg.mooncake, self.workdir / "logs")]
        for p in self.procs:  # their wildcard binds land on loopback (cluster/loopback)
            p.env.update(loopback.env())
        self.prefill_engine = self.decode_engine = None
        self._client = None

    def start_store(self) -> Path:
        """Starts the Mooncake master and store; returns the workers' Mooncake JSON."""
        for p in self.procs:
            p.start()
            p.wait_ready(60)
        return mooncake.write_worker_config(self.cfg.mooncake, self.workdir / "mooncake.json")

    async def start(self, progress=print) -> None:
        """Starts master, store and both engines (about a minute on 2 cores)."""
        os.environ["MOONCAKE_CONFIG_PATH"] = str(self.start_store())
        # The engines' processes start from this environment: their transfer engines bind loopback.
        os.environ.update(loopback.env())
        engines = []
        with _pair_env():
            for role in ("prefill", "decode"):
                t0 = time.monotonic()
                progress(f"starting {role} engine ...")
                engines.append(start_engine(self.cfg, role))
                progress(f"{role} engine ready in {time.monotonic() - t0:.0f}s")
        self.prefill_engine, self.decode_engine = engines

    async def prefill(self, prompt: list[int]) -> None:
        """Computes `prompt` on the prefill engine and waits until its KV is in the pool."""
        await prefill_on(self.prefill_engine, prompt)

    async def decode(self, prompt: list[int], max_tokens: int = 8) -> Decoded:
        """Greedy generation on the decode engine; cached tokens include those loaded from the store."""
        return await decode_on(self.decode_engine, prompt, max_tokens)

    async def spill_stats(self, role: str) -> dict:
        engine = self.prefill_engine if role == "prefill" else self.decode_engine
        return (await engine.collective_rpc("spill_stats"))[0]

    async def wait_spilled(self, timeout: float = 60) -> None:
        """Waits until the prefill worker's write-behind queue is empty and both tiers list its files."""
        deadline = time.monotonic() + timeout
        while (await self.spill_stats("prefill")).get("pending", 0) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self.refresh_spill_index()

    async def refresh_spill_index(self) -> None:
        """Has both engines' tiers list the spill directory now, rather than within their rescan period."""
        for engine in (self.prefill_engine, self.decode_engine):
            await engine.collective_rpc("spill_refresh")

    async def reset_local_caches(self) -> None:
        """Empties both engines' own prefix caches; the store and the spill tier keep their KV."""
        for engine in (self.prefill_engine, self.decode_engine):
            await engine.reset_prefix_cache(reset_running_requests=False, reset_connector=False)

    def spill_files(self) -> dict[str, str]:
        """Spill file path -> store key, for every object on disk."""
        out = {}
        for path, _, _ in walk_objects(self.cfg.spill_path()):
            try:
                key = read_key(Path(path))
            except FileNotFoundError:
                continue
            if key:
                out[path] = key
        return out

    def store_client(self):
        """A Mooncake client of this process (contributing no memory) to inspect or trim the pool."""
        if self._client is None:
            from mooncake.store import MooncakeDistributedStore

            m = self.cfg.mooncake
            self._client = MooncakeDistributedStore()
            rc = self._client.setup(m.host, mooncake.metadata_url(m), 0, 64 << 20, m.protocol,
                                    m.device_name, f"{m.host}:{m.master_port}")
            if rc != 0:
                raise RuntimeError(f"Mooncake client setup failed: {rc}")
        return self._client

    def close(self) -> None:
        """Shuts the engines down (both at once: each waits seconds for its engine core and
        worker to exit) and stops the master and store this rig started."""
        engines = [e for e in (self.prefill_engine, self.decode_engine) if e is not None]
        if engines:
            with ThreadPoolExecutor(len(engines)) as pool:
                list(pool.map(lambda e: e.shutdown(), engines))
        if self._client is not None:
            self._client.close()
        for p in reversed(self.procs):
            p.stop()
