"""A vLLM worker extension that answers questions about in-flight KV saves.

MooncakeStoreConnector saves KV on a background thread, so a prefill request
finishes before its blocks are in the store. A decode that looked up the
prompt at that moment would find only part of it and recompute the rest.
The prefill replica therefore asks, through `collective_rpc`, how many store
jobs of its request are still queued, and hands the request to decode once
that reaches zero.

It also reports the counters of the worker's NVMe spill tier
(kvstore/spill_store.py). Loaded into the worker process with
`worker_extension_cls`; it reads the connector's state and changes nothing.
"""

from __future__ import annotations


class KVProbeExtension:
    def pending_kv_saves(self, request_id: str) -> int:
        """Queued Mooncake store jobs of `request_id` (external id) on this worker."""
        from vllm.distributed.kv_transfer.kv_transfer_state import (
            get_kv_transfer_group,
            has_kv_transfer_group,
        )

        if not has_kv_transfer_group():
            return 0
        worker = getattr(get_kv_transfer_group(), "connector_worker", None)
        sender = getattr(worker, "kv_send_thread", None)
        if sender is None:
            return 0
        prefix = request_id + "-"
        return sum(
            len(jobs)
            for req_id, jobs in list(sender.stored_requests.items())
            if req_id == request_id or req_id.startswith(prefix)
        )

    def spill_stats(self) -> dict:
        """Counters of this worker's spill tier (promotions, spills, evictions, pending); {} if off."""
        from kvstore.connector import ACTIVE

        return ACTIVE[-1].snapshot() if ACTIVE else {}
