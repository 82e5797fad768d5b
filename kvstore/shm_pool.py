"""Pool reads through shared memory when the Mooncake store runs on this host.

A worker's own Mooncake client reads the pool over the transfer engine, on
CPU machines its TCP transport: the store process sends every byte through
a loopback socket. Mooncake also has a "dummy" client that talks to a real
client (the store process) on the same host over a Unix socket, and shares
a memory pool with it: the real client copies an object from its segment
straight into that shared memory. `ShmPoolReader` wraps the worker's store
handle and serves `batch_get_into_multi_buffers` that way: objects land in
a shared staging area, then one copy scatters each into the engine's KV
buffers (the staging area must be shared memory, and vLLM's KV cache is
not). Everything else, and any read the shared path cannot serve, goes to
the wrapped handle over the transfer engine.

`attach` returns None (the caller keeps the plain handle) when the store is
not on this host or refuses the shared pool.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import Counter

log = logging.getLogger(__name__)


class ShmPoolReader:
    def __init__(self, store, dummy, staging_addr: int, staging_bytes: int):
        self._store = store
        self._dummy = dummy
        self._staging = staging_addr
        self.staging_bytes = staging_bytes
        self._lock = threading.Lock()  # one staging area: the workers' load threads take turns
        self.stats: Counter[str] = Counter()

    def __getattr__(self, name):
        return getattr(self._store, name)

    def batch_get_into_multi_buffers(self, keys, all_addrs, all_sizes, *args, **kwargs) -> list[int]:
        """Loads each key into its buffers (the slices of `all_addrs[i]`, `all_sizes[i]`); per key the
        bytes loaded, or a negative code. Keys the shared path missed are read over the transfer engine."""
        res = [-1] * len(keys)
        try:
            self._shared_get(keys, all_addrs, all_sizes, res)
        except Exception as exc:  # noqa: BLE001 - the transfer engine still serves every key
            log.warning("shared-memory pool read failed (%s); reading over the transfer engine", exc)
        missed = [i for i, r in enumerate(res) if r < 0]
        if missed:
            got = self._store.batch_get_into_multi_buffers(
                [keys[i] for i in missed], [all_addrs[i] for i in missed], [all_sizes[i] for i in missed],
                *args, **kwargs)
            for i, r in zip(missed, got):
                res[i] = r
            self.stats["fallback_keys"] += len(missed)
        return res

    def _shared_get(self, keys, all_addrs, all_sizes, res: list[int]) -> None:
        totals = [sum(s) for s in all_sizes]
        batch: list[int] = []
        used = 0
        for i, n in enumerate(totals):
            if n > self.staging_bytes:
                continue  # larger than the staging area: over the transfer engine
            if used + n > self.staging_bytes:
                self._load(batch, keys, all_addrs, all_sizes, totals, res)
                batch, used = [], 0
            batch.append(i)
            used += n
        self._load(batch, keys, all_addrs, all_sizes, totals, res)

    def _load(self, batch: list[int], keys, all_addrs, all_sizes, totals, res: list[int]) -> None:
        if not batch:
            return
        offsets, off = [], 0
        for i in batch:
            offsets.append(off)
            off += totals[i]
        with self._lock:
            t0 = time.perf_counter()
            got = self._dummy.batch_get_into([keys[i] for i in batch], [self._staging + o for o in offsets],
                                             [totals[i] for i in batch])
            loaded = 0
            for i, o, r in zip(batch, offsets, got):
                if r != totals[i]:
                    continue  # missing or short: the transfer engine tries it
                src = self._staging + o
                for addr, size in zip(all_addrs[i], all_sizes[i]):
                    ctypes.memmove(addr, src, size)
                    src += size
                res[i] = r
                loaded += 1
            self.stats.update(shm_load_s=time.perf_counter() - t0, shm_loaded=loaded,
                              shm_loaded_bytes=sum(res[i] for i in batch if res[i] > 0))


def attach(store, store_address: str, staging_bytes: int) -> ShmPoolReader | None:
    """`store` wrapped to read the pool through shared memory with the store process at
    `store_address` (host:port of its real client service), or None where that cannot work."""
    try:
        from mooncake.store import MooncakeDistributedStore

        dummy = MooncakeDistributedStore()
        # The dummy's own transfer buffer is unused here (reads land in the shared pool).
        if dummy.setup_dummy(staging_bytes, 16 << 20, store_address) != 0:
            raise RuntimeError(f"setup_dummy({store_address}) failed")
        addr = dummy.alloc_from_mem_pool(staging_bytes)
        if not addr or dummy.register_buffer(addr, staging_bytes) != 0:
            raise RuntimeError("the store did not map the shared staging area")
    except Exception as exc:  # noqa: BLE001 - not on the store's host, or an older Mooncake
        log.info("pool reads stay on the transfer engine: %s", exc)
        return None
    return ShmPoolReader(store, dummy, addr, staging_bytes)
