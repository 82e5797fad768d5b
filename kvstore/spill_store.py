"""A Mooncake store handle with Baton's spill tier behind it.

vLLM's MooncakeStoreConnector talks to Mooncake through one
`MooncakeDistributedStore` object. `SpillingStore` wraps that object and
changes three calls; everything else passes through:

- `batch_put_from_multi_buffers`: after the put, each key is queued for the
  write-behind thread, which writes it to the spill tier. With host buffers
  (CPU engines) the object is copied out of the engine's buffers first (one
  memcpy), so nothing is read back from the pool; a key the pool *rejects*
  (full pool, Mooncake#3331) is written to disk at once, from the engine's
  buffers, so it is there when a consumer looks it up. Past `backlog_bytes` of
  queued copies, or with device buffers, the writer reads accepted keys back
  from the pool instead (counted as `pool_reread_bytes`).
- `batch_is_exist`: for a lookup, a key missing from the pool that the
  tier's index lists (or, past the index, whose file a `stat` finds) is
  reported present (the save path's check before a put
  sees the pool only). With host buffers it is then loaded straight from its
  file into the engine's buffers, and never put back into the pool; with
  device buffers it is promoted into the pool first (one `put_batch`).
- `batch_get_into_multi_buffers`: keys the last lookups found only on disk
  are read from their files (several at a time, straight into the buffers);
  the rest come from the pool, and what the pool no longer has falls back to
  the disk (and the other way round). A corrupted file is a miss: vLLM
  recomputes those blocks. A producer (`republish`) then puts what came
  from disk back into the pool from its buffers, for consumers on nodes
  whose spill directory is another.

`stats` counts the store traffic (bytes saved into the pool, read back from
it and promoted into it; bytes loaded per tier and the seconds the loads
took). Neither path raises on tier
trouble. No vLLM or torch import.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
import time
from collections import Counter, OrderedDict
from typing import Callable

from kvstore.spill import SpillTier

log = logging.getLogger(__name__)
_BATCH = 64
_DISK_KEYS_MAX = 65536


def host_views(addrs: list[int], sizes: list[int]) -> list[memoryview]:
    """Writable byte views of host memory ranges (the engine's KV buffers)."""
    return [memoryview((ctypes.c_char * n).from_address(a)).cast("B") for a, n in zip(addrs, sizes)]


def copy_out(addrs: list[int], sizes: list[int]) -> bytearray:
    """One contiguous copy of host memory ranges."""
    out = bytearray(sum(sizes))
    base = ctypes.addressof((ctypes.c_char * len(out)).from_buffer(out)) if out else 0
    off = 0
    for a, n in zip(addrs, sizes):
        ctypes.memmove(base + off, a, n)
        off += n
    return out


class SpillingStore:
    def __init__(self, store, tier: SpillTier, host_buffers: bool, queue_max: int = 65536,
                 backlog_bytes: int = 256 << 20, saving: Callable[[], bool] = lambda: False,
                 republish: bool = False):
        self._store = store
        self._saving = saving
        self.republish = republish
        self.tier = tier
        self.host_buffers = host_buffers
        self.backlog_bytes = backlog_bytes
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._backlog = 0  # bytes of copies waiting for the writer
        self._disk_keys: OrderedDict[str, None] = OrderedDict()  # reported present from disk only
        self._queue: queue.Queue = queue.Queue(maxsize=queue_max)
        self._writer = threading.Thread(target=self._write_behind, name="baton-spill", daemon=True)
        self._writer.start()

    def __getattr__(self, name):
        return getattr(self._store, name)

    def _count(self, **counts) -> None:
        with self._lock:
            self.stats.update(counts)

    # -- read path --------------------------------------------------------
    def batch_is_exist(self, keys: list[str]) -> list[int]:
        """Presence per key in the pool or, by the tier's index (no disk read), on disk;
        with device buffers, disk-only keys are promoted into the pool first. For the
        save path's own check (`saving()`), presence in the pool only."""
        res = list(self._store.batch_is_exist(keys))
        if self._saving():
            # The save path asks whether a put is needed: an object only on
            # disk is put into the pool again, since another node's engine
            # loads from the pool (its own spill directory may not have it).
            return res
        on_disk = self._on_disk(keys, res)
        if not on_disk:
            return res
        if self.host_buffers:
            with self._lock:
                for i in on_disk:
                    res[i] = 1
                    self._disk_keys[keys[i]] = None
                    self._disk_keys.move_to_end(keys[i])
                while len(self._disk_keys) > _DISK_KEYS_MAX:
                    self._disk_keys.popitem(last=False)
            return res
        for i in self._promote([keys[i] for i in on_disk]):
            res[on_disk[i]] = 1
        return res

    def _on_disk(self, keys: list[str], in_pool: list[int]) -> list[int]:
        """Positions of keys the pool lacks and the disk has: by the tier's index, and from
        the first key the index does not list on, by looking at the disk (a `stat` per key,
        until one is missing), since another process may have spilled it since the last
        listing (a put the pool refused is spilled before the save completes)."""
        found, probing = [], True
        for i, key in enumerate(keys):
            if in_pool[i] == 1:
                continue
            if self.tier.contains(key):
                found.append(i)
            elif probing and self.tier.probe(key):
                found.append(i)
            else:
                probing = False
        return found

    def _promote(self, keys: list[str]) -> list[int]:
        """Puts the disk objects of `keys` into the pool in one batch; the positions promoted."""
        found = [(i, data) for i, data in enumerate(self.tier.get_many(keys)) if data is not None]
        if not found:
            return []
        try:
            rc = self._store.put_batch([keys[i] for i, _ in found], [data for _, data in found])
            there = self._store.batch_is_exist([keys[i] for i, _ in found]) if rc != 0 else [1] * len(found)
        except Exception as exc:  # noqa: BLE001 - a failed promotion is a miss
            log.warning("promotion of %d keys failed: %s", len(found), exc)
            there = [0] * len(found)
        done = [i for (i, _), ok in zip(found, there) if ok == 1]
        self._count(promoted=len(done), promote_rejected=len(found) - len(done),
                    pool_promote_bytes=sum(len(d) for _, d in found))
        return done

    def batch_get_into_multi_buffers(self, keys, all_addrs, all_sizes, *args, **kwargs):
        """Loads each key from the tier the lookups found it in, then from the other tier what failed."""
        if not self.host_buffers:
            return self._pool_get(keys, all_addrs, all_sizes, range(len(keys)), *args, **kwargs)
        with self._lock:
            disk_first = {i for i, k in enumerate(keys) if k in self._disk_keys}
            for i in disk_first:
                del self._disk_keys[keys[i]]
        res = [-1] * len(keys)
        pool_first = [i for i in range(len(keys)) if i not in disk_first]
        self._fill(res, self._pool_get(keys, all_addrs, all_sizes, pool_first, *args, **kwargs), pool_first)
        self._fill(res, self._disk_get(keys, all_addrs, all_sizes, sorted(disk_first)), sorted(disk_first))
        retry_disk = [i for i in pool_first if res[i] < 0]
        self._fill(res, self._disk_get(keys, all_addrs, all_sizes, retry_disk), retry_disk)
        retry_pool = [i for i in disk_first if res[i] < 0]
        self._fill(res, self._pool_get(keys, all_addrs, all_sizes, retry_pool, *args, **kwargs), retry_pool)
        if self.republish:
            self._republish(keys, all_addrs, all_sizes, [i for i in sorted(disk_first) + retry_disk if res[i] >= 0])
        return res

    def _republish(self, keys, all_addrs, all_sizes, positions: list[int]) -> None:
        """Puts what was just loaded from disk back into the pool, from the engine's buffers
        (no disk read): a producer's KV must reach consumers on nodes that cannot see its disk."""
        if not positions:
            return
        try:
            rcs = self._store.batch_put_from_multi_buffers(
                [keys[i] for i in positions], [all_addrs[i] for i in positions], [all_sizes[i] for i in positions])
        except Exception as exc:  # noqa: BLE001 - the load itself succeeded
            log.warning("republishing %d keys failed: %s", len(positions), exc)
            return
        done = [i for i, rc in zip(positions, rcs) if rc >= 0]
        self._count(republished=len(done), pool_promote_bytes=sum(sum(all_sizes[i]) for i in done))

    @staticmethod
    def _fill(res: list[int], got: list[int], positions) -> None:
        for i, r in zip(positions, got):
            res[i] = r

    def _pool_get(self, keys, all_addrs, all_sizes, positions, *args, **kwargs) -> list[int]:
        positions = list(positions)
        if not positions:
            return []
        t0 = time.perf_counter()
        got = list(self._store.batch_get_into_multi_buffers(
            [keys[i] for i in positions], [all_addrs[i] for i in positions],
            [all_sizes[i] for i in positions], *args, **kwargs))
        self._count(pool_load_s=time.perf_counter() - t0, pool_loaded=sum(r >= 0 for r in got),
                    pool_load_bytes=sum(sum(all_sizes[i]) for i, r in zip(positions, got) if r >= 0))
        return got

    def _disk_get(self, keys, all_addrs, all_sizes, positions: list[int]) -> list[int]:
        if not positions:
            return []
        t0 = time.perf_counter()
        got = self.tier.read_many_into([(keys[i], host_views(all_addrs[i], all_sizes[i])) for i in positions])
        got = [r if r is not None else -1 for r in got]
        self._count(disk_load_s=time.perf_counter() - t0, loaded_from_disk=sum(r >= 0 for r in got),
                    loaded_from_disk_bytes=sum(r for r in got if r > 0))
        return got

    # -- write path -------------------------------------------------------
    def batch_put_from_multi_buffers(self, keys, all_addrs, all_sizes, *args, **kwargs):
        """Puts into the pool, then queues every key for the disk (with a copy of host buffers)."""
        res = self._store.batch_put_from_multi_buffers(keys, all_addrs, all_sizes, *args, **kwargs)
        refused = saved = 0
        for key, addrs, sizes, rc in zip(keys, all_addrs, all_sizes, res):
            size = sum(sizes)
            saved += size if rc >= 0 else 0
            refused += size if rc < 0 else 0
            if self.tier.full:
                self._count(skipped_full=1)
            elif self.tier.contains(key):
                self._count(already_on_disk=1)
            elif rc < 0 and self.host_buffers:
                # The pool refused it: write it now, from the engine's buffers, so
                # it is on disk before the save completes and a consumer looks it up.
                if self.tier.put(key, host_views(addrs, sizes)):
                    self._count(spilled_refused=1)
            elif self.host_buffers and self._reserve(size):
                self._enqueue((key, copy_out(addrs, sizes)), size)
            elif rc >= 0:
                self._enqueue((key, None), 0)  # read back from the pool by the writer
            else:
                self._count(rejected_not_spilled=1)
        # A refused put fails at allocation on the master, before any byte moves.
        self._count(saved_bytes=saved, pool_refused_bytes=refused)
        return res

    def _reserve(self, size: int) -> bool:
        with self._lock:
            if self._backlog + size > self.backlog_bytes:
                self.stats["backlog_full"] += 1
                return False
            self._backlog += size
            return True

    def _enqueue(self, item: tuple, reserved: int) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._count(queue_full=1)
            self._release(reserved)

    def _release(self, size: int) -> None:
        with self._lock:
            self._backlog -= size

    def _write_behind(self) -> None:
        while True:
            batch = [self._queue.get()]
            while batch[-1] is not None and len(batch) < _BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = batch[-1] is None
            try:
                self._spill([item for item in batch if item is not None])
            except Exception as exc:  # noqa: BLE001 - the writer must outlive store trouble
                log.warning("write-behind spill failed: %s", exc)
                self._count(spill_errors=1)
            finally:
                for _ in batch:
                    self._queue.task_done()
            if stop:
                return

    def _spill(self, items: list[tuple]) -> None:
        reread = [key for key, data in items if data is None and not self.tier.contains(key)]
        for key, data in items:
            if data is not None:
                try:
                    if self.tier.put(key, data):
                        self._count(spilled=1)
                finally:
                    self._release(len(data))
        if reread and not self.tier.full:
            for key, data in zip(reread, self._store.get_batch(reread)):
                self._count(pool_reread_bytes=len(data or b""))
                if data and self.tier.put(key, data):
                    self._count(spilled=1)
                elif not data:
                    self._count(gone_before_spill=1)

    def pending(self) -> int:
        """Keys still waiting for the write-behind thread."""
        return self._queue.unfinished_tasks

    def snapshot(self) -> dict:
        """Counters of this handle and its tier, plus pending writes."""
        with self._lock:
            mine = dict(self.stats)
        return {**mine, **{f"tier_{k}": v for k, v in self.tier.stats.items()}, "pending": self.pending()}

    def close(self, *args, **kwargs):
        """Stops the writer (after what is queued), the tier's threads, and closes the wrapped store."""
        try:
            self._queue.put(None, timeout=5)
        except queue.Full:
            pass  # the daemon writer dies with the process
        self._writer.join(timeout=10)
        self.tier.close()
        return self._store.close(*args, **kwargs)
