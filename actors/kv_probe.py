"""A vLLM worker extension that answers questions about in-flight KV saves.

MooncakeStoreConnector saves KV on a background thread, so a prefill request
finishes before its blocks are in the store. A decode that looked up the
prompt at that moment would find only part of it and recompute the rest.
The prefill replica therefore asks, through `collective_rpc`, how many store
jobs of its request are still queued, and hands the request to decode once
that reaches zero.

Rather than being asked again and again, the worker also tells: after
`watch_kv_saves(address)`, each time a request's last queued store job
finishes, the worker pushes that request's id to `address` (a ZMQ PULL
socket of the replica, actors/save_watch.py).

It also reports the counters of the worker's NVMe spill tier
(kvstore/spill_store.py). Loaded into the worker process with
`worker_extension_cls`; it reads the connector's state and changes nothing
but the notification it adds.
"""

from __future__ import annotations


def _sender():
    from vllm.distributed.kv_transfer.kv_transfer_state import (
        get_kv_transfer_group,
        has_kv_transfer_group,
    )

    if not has_kv_transfer_group():
        return None
    worker = getattr(get_kv_transfer_group(), "connector_worker", None)
    return getattr(worker, "kv_send_thread", None)


class KVProbeExtension:
    def watch_kv_saves(self, address: str) -> bool:
        """Pushes a request's id to `address` whenever its last queued store job
        finishes, from the sending thread. Returns False (nothing changed) where
        this worker saves no KV. Calling it again moves the pushes to `address`."""
        import threading

        import zmq

        sender = _sender()
        if sender is None:
            return False
        sock = zmq.Context.instance().socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.connect(address)
        lock = threading.Lock()  # one socket, used from the sending thread(s)
        finish = type(sender).finish_store_job  # the class's, so a second call does not nest

        def finish_store_job(req_meta) -> None:
            finish(sender, req_meta)
            with sender.done_task_lock:
                empty = not sender.stored_requests.get(req_meta.req_id)
            if empty:
                with lock:
                    try:
                        sock.send_string(req_meta.req_id, zmq.NOBLOCK)
                    except zmq.ZMQError:
                        pass  # the replica still asks with pending_kv_saves

        sender.finish_store_job = finish_store_job
        return True

    def pending_kv_saves(self, request_id: str) -> int:
        """Queued Mooncake store jobs of `request_id` (external id) on this worker."""
        sender = _sender()
        if sender is None:
            return 0
        prefix = request_id + "-"
        return sum(
            len(jobs)
            for req_id, jobs in list(sender.stored_requests.items())
            if req_id == request_id or req_id.startswith(prefix)
        )

    def spill_stats(self) -> dict:
        """Counters of this worker's spill tier (promotions, spills, evictions, pending) and of its
        shared-memory pool reads (shm_*); {} if neither is on."""
        from kvstore.connector import ACTIVE, SHM_READERS

        out = ACTIVE[-1].snapshot() if ACTIVE else {}
        if SHM_READERS:
            out.update(SHM_READERS[-1].stats)
        return out

    def spill_refresh(self) -> int:
        """Lists the spill directory into this worker's tier index now (it does every
        few seconds by itself); returns the objects it lists. -1 if the tier is off."""
        from kvstore.connector import ACTIVE

        if not ACTIVE:
            return -1
        ACTIVE[-1].tier.refresh()
        return len(ACTIVE[-1].tier.index)
