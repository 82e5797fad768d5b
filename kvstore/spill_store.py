"""A Mooncake store handle with Baton's spill tier behind it.

vLLM's MooncakeStoreConnector talks to Mooncake through one
`MooncakeDistributedStore` object. `SpillingStore` wraps that object and
changes three calls; everything else passes through:

- `batch_put_from_multi_buffers`: after the put, each accepted key is queued
  for the write-behind thread, which reads the object back from the memory
  pool and writes it to the spill tier. A key the pool *rejects* (full pool,
  Mooncake#3331) is written to the tier straight from the engine's buffers
  when they are host memory, before the engine reuses them.
- `batch_is_exist`: a key missing from the pool but sound on disk is put back
  into the pool (promotion) and reported present, so the connector then loads
  it like any memory hit. A corrupted file is a miss: the engine recomputes.
- `batch_get_into_multi_buffers`: a key the pool no longer has (a full pool
  refused the promotion, or it was evicted again) is read from disk straight
  into the engine's buffers when they are host memory. Without host buffers a
  refused promotion is a miss.

Neither path raises on tier trouble; the engine never waits on the disk
except for promotion reads. No vLLM or torch import.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
from collections import Counter

from kvstore.spill import SpillTier

log = logging.getLogger(__name__)
_BATCH = 64


class SpillingStore:
    def __init__(self, store, tier: SpillTier, host_buffers: bool, queue_max: int = 65536):
        self._store = store
        self.tier = tier
        self.host_buffers = host_buffers
        self.stats: Counter[str] = Counter()
        self._queue: queue.Queue[str | None] = queue.Queue(maxsize=queue_max)
        self._writer = threading.Thread(target=self._write_behind, name="baton-spill", daemon=True)
        self._writer.start()

    def __getattr__(self, name):
        return getattr(self._store, name)

    # -- read path --------------------------------------------------------
    def batch_is_exist(self, keys: list[str]) -> list[int]:
        """Pool presence per key, after promoting sound on-disk objects into the pool."""
        res = list(self._store.batch_is_exist(keys))
        for i, key in enumerate(keys):
            if res[i] == 1 or not self.tier.contains(key):
                continue
            data = self.tier.get(key)
            if data is None:
                continue
            try:
                rc = self._store.put(key, data)
            except Exception as exc:  # noqa: BLE001 - a failed promotion is a miss
                log.warning("promotion of %s failed: %s", key, exc)
                rc = -1
            if rc == 0:
                res[i] = 1
                self.stats["promoted"] += 1
                self.stats["promoted_bytes"] += len(data)
            else:
                self.stats["promote_rejected"] += 1
                if self.host_buffers:
                    res[i] = 1  # batch_get_into_multi_buffers reads it from disk
        return res

    def batch_get_into_multi_buffers(self, keys, all_addrs, all_sizes, *args, **kwargs):
        """Loads from the pool; keys it lacks are read from disk into host buffers."""
        res = list(self._store.batch_get_into_multi_buffers(keys, all_addrs, all_sizes, *args, **kwargs))
        if not self.host_buffers:
            return res
        for i, (key, addrs, sizes) in enumerate(zip(keys, all_addrs, all_sizes)):
            if res[i] >= 0:
                continue
            data = self.tier.get(key)
            if data is None or len(data) != sum(sizes):
                continue
            off = 0
            for addr, size in zip(addrs, sizes):
                ctypes.memmove(addr, data[off:off + size], size)
                off += size
            res[i] = len(data)
            self.stats["loaded_from_disk"] += 1
            self.stats["loaded_from_disk_bytes"] += len(data)
        return res

    # -- write path -------------------------------------------------------
    def batch_put_from_multi_buffers(self, keys, all_addrs, all_sizes, *args, **kwargs):
        """Puts into the pool, then queues accepted keys for the disk and spills rejected ones directly."""
        res = self._store.batch_put_from_multi_buffers(keys, all_addrs, all_sizes, *args, **kwargs)
        for key, addrs, sizes, rc in zip(keys, all_addrs, all_sizes, res):
            if rc >= 0:
                self._enqueue(key)
            elif self.host_buffers and not self.tier.full:
                data = b"".join(ctypes.string_at(a, n) for a, n in zip(addrs, sizes))
                if self.tier.put(key, data):
                    self.stats["spilled_rejected"] += 1
            else:
                self.stats["rejected_not_spilled"] += 1
        return res

    def _enqueue(self, key: str) -> None:
        if self.tier.full:
            self.stats["skipped_full"] += 1
            return
        try:
            self._queue.put_nowait(key)
        except queue.Full:
            self.stats["queue_full"] += 1

    def _write_behind(self) -> None:
        while True:
            key = self._queue.get()
            batch = [key]
            while key is not None and len(batch) < _BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in batch
            try:
                self._spill([k for k in batch if k is not None])
            except Exception as exc:  # noqa: BLE001 - the writer must outlive store trouble
                log.warning("write-behind spill failed: %s", exc)
                self.stats["spill_errors"] += 1
            finally:
                for _ in batch:
                    self._queue.task_done()
            if stop:
                return

    def _spill(self, keys: list[str]) -> None:
        keys = [k for k in keys if not self.tier.contains(k)]
        if not keys or self.tier.full:
            return
        for key, data in zip(keys, self._store.get_batch(keys)):
            if data:
                if self.tier.put(key, bytes(data)):
                    self.stats["spilled"] += 1
            else:
                self.stats["gone_before_spill"] += 1

    def pending(self) -> int:
        """Keys still waiting for the write-behind thread."""
        return self._queue.unfinished_tasks

    def snapshot(self) -> dict:
        """Counters of this handle and its tier, plus pending writes."""
        return {**self.stats, **{f"tier_{k}": v for k, v in self.tier.stats.items()},
                "pending": self.pending()}

    def close(self, *args, **kwargs):
        """Stops the writer (after what is queued) and closes the wrapped store."""
        try:
            self._queue.put(None, timeout=5)
        except queue.Full:
            pass  # the daemon writer dies with the process
        self._writer.join(timeout=10)
        return self._store.close(*args, **kwargs)
