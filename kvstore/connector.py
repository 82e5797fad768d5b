"""Baton's vLLM KV connector: MooncakeStoreConnector plus identity and spill tier.

Loaded by name (`kv_connector="BatonStoreConnector"`,
`kv_connector_module_path="kvstore.connector"`). It changes two things:

- every Mooncake key carries the model identity digest (kvstore/identity.py)
  as vLLM's `cache_prefix`, on the scheduler and on the worker alike;
- with `baton_spill` in `kv_connector_extra_config` ({"dir", "cap_bytes",
  "min_free_bytes"}), the worker's store handle is wrapped in a
  SpillingStore, so pool evictions are backed by the NVMe tier;
- with `baton_shm_store` ({"address", "staging_bytes"}: the store process's
  real-client service on this host) and host KV buffers, pool reads go
  through shared memory with the store (kvstore/shm_pool.py);
- with `baton_master_http` (the Mooncake master's HTTP port), the worker's store
  handle is wrapped in an AuditedStore (kvstore/holdings.py): every
  `baton_audit_s` seconds it checks that some tier still holds what this worker put, and publishes `BlockRemoved` (medium "cpu") for what none does,
  so the router's index drops store holdings when the store does.

A request whose `kv_transfer_params` carry `baton_no_lookup` skips the
scheduler's store lookup (a round trip to the store per request): the front
sends it when the router's index says the store holds nothing more.

The live SpillingStore of this process is kept in `ACTIVE` for the worker
extension (actors/kv_probe.py) that reports its counters.
"""

from __future__ import annotations

import threading
from pathlib import Path

from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.connector import (
    MooncakeStoreConnector,
)

from common.constants import NO_LOOKUP
from kvstore.holdings import AuditedStore, event_hash, master_presence
from kvstore.identity import ModelIdentity, config_digest
from kvstore.shm_pool import ShmPoolReader, attach
from kvstore.spill import SpillTier
from kvstore.spill_store import SpillingStore

ACTIVE: list[SpillingStore] = []
SHM_READERS: list[ShmPoolReader] = []


def model_identity(vllm_config, kv_cache_config) -> ModelIdentity:
    """The identity of the KV this engine produces, from its resolved config."""
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    cfg_file = Path(mc.model) / "config.json"
    arch = config_digest(cfg_file.read_text()) if cfg_file.exists() else mc.model
    groups = [
        f"{type(g.kv_cache_spec).__name__}:{','.join(g.layer_names)}"
        for g in (kv_cache_config.kv_cache_groups if kv_cache_config else [])
    ]
    return ModelIdentity(
        model=f"{mc.served_model_name}@{arch}",
        dtype=str(mc.dtype).removeprefix("torch."),
        kv_cache_dtype=str(cc.cache_dtype),
        block_size=int(cc.block_size),
        num_layers=mc.get_num_layers(pc),
        num_kv_heads=mc.get_num_kv_heads(pc),
        head_dim=mc.get_head_size(),
        layer_layout=";".join(groups),
        parallel=f"tp{pc.tensor_parallel_size}pp{pc.pipeline_parallel_size}",
    )


class BatonStoreConnector(MooncakeStoreConnector):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        self.identity = model_identity(vllm_config, kv_cache_config)
        extra["cache_prefix"] = f"baton-{self.identity.digest}"
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.spill: SpillingStore | None = None
        self.shm: ShmPoolReader | None = None
        worker = self.connector_worker
        shm = extra.get("baton_shm_store")
        host = vllm_config.device_config.device_type == "cpu"
        if shm and host and worker is not None and getattr(worker, "store", None) is not None:
            self.shm = attach(worker.store, shm["address"], int(shm["staging_bytes"]))
            if self.shm is not None:
                worker.store = self.shm
                SHM_READERS.append(self.shm)
        spill = extra.get("baton_spill")
        if spill and worker is not None and getattr(worker, "store", None) is not None:
            tier = SpillTier(spill["dir"], self.identity.digest, cap_bytes=int(spill["cap_bytes"]),
                             min_free_bytes=int(spill.get("min_free_bytes", 0)))
            saving = lambda: threading.current_thread() is getattr(worker, "kv_send_thread", None)  # noqa: E731
            producer = vllm_config.kv_transfer_config.kv_role in ("kv_producer", "kv_both")
            self.spill = worker.store = SpillingStore(worker.store, tier, host_buffers=host, saving=saving,
                                                      republish=producer)
            ACTIVE.append(self.spill)
        master_http = extra.get("baton_master_http")
        if master_http and worker is not None and getattr(worker, "store", None) is not None:
            presence = master_presence(master_http, self.spill.tier.contains if self.spill else None)
            worker.store = AuditedStore(worker.store, presence, self._report_gone,
                                        interval_s=float(extra.get("baton_audit_s", 1.0)))

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """The store's hit for `request`, or none without asking when the front said
        the store holds no more of it than this engine's cache (`NO_LOOKUP`)."""
        if (getattr(request, "kv_transfer_params", None) or {}).get(NO_LOOKUP):
            return 0, False
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def _report_gone(self, keys: list[str]) -> None:
        """Queues `BlockRemoved` for store keys no tier holds, on the engine's KV event stream."""
        from vllm import envs
        from vllm.distributed.kv_events import BlockRemoved

        sender = getattr(self.connector_worker, "kv_send_thread", None)
        if sender is None or not self.connector_worker.enable_kv_events:
            return  # this engine publishes no store events, so it announced none of these
        ints = envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES
        sender.update_kv_event([BlockRemoved(block_hashes=[event_hash(k, ints)], medium="cpu") for k in keys])

    def shutdown(self):
        if self.spill is not None and self.spill in ACTIVE:
            ACTIVE.remove(self.spill)
        if self.shm is not None and self.shm in SHM_READERS:
            SHM_READERS.remove(self.shm)
        super().shutdown()
