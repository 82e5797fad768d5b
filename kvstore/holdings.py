"""What this worker put into the Mooncake store, checked against what the store still holds.

The router's index learns of store holdings from the prefill engines'
`BlockStored` events (medium "cpu"), sent after a put succeeded. Nothing
tells it when the store lets go of an object: Mooncake's memory pool evicts
silently, and the spill tier evicts by its own LRU. So the worker that put a
key keeps checking that some tier still holds it, and reports the keys no
tier holds any more as `BlockRemoved` events on the same sequenced stream,
which the KV indexer applies like any other event.

- `StoreAudit` is the pure bookkeeping: keys put, checked a slice at a time
  (a whole pass every `len(keys) / batch` rounds), at most `max_keys` kept;
  a key dropped for the cap is reported gone too, since nobody would check
  it again (an index that misses a block under-predicts; one that keeps a
  block the store lost mis-routes).
- `AuditedStore` wraps the worker's store handle, records the keys each
  batch put accepted, and runs the audit on a thread.

Presence is read from the Mooncake master's key listing (`master_presence`),
not with `batch_is_exist`: the master grants a read lease on every key that
call finds, so an audit through it would keep every audited object leased
and the pool could never evict (puts then fail with -200). A round whose
listing cannot be read reports nothing. No vLLM or torch import.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.request
from collections import OrderedDict
from typing import Callable, Iterable

log = logging.getLogger(__name__)

Presence = Callable[[list[str]], list[bool]]


def event_hash(key: str, int_hashes: bool = True) -> int | bytes:
    """The block hash vLLM's `BlockStored` carries for the block stored under `key`.

    A store key ends in `@<chunk hash hex>`; with vLLM's integer event hashes
    (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, the default) the event carries the
    hash's last 8 bytes as a big-endian integer, otherwise the bytes themselves.
    """
    digest = key.rsplit("@", 1)[-1]
    return int(digest[-16:], 16) if int_hashes else bytes.fromhex(digest)


def master_presence(master_http: str, on_disk: Callable[[str], bool] | None = None,
                    timeout_s: float = 5.0) -> Presence:
    """A presence check over the master's `/get_all_keys` listing (one GET a call, no
    leases), plus `on_disk(key)` for the spill tier; raises if the listing cannot be read."""
    def presence(keys: list[str]) -> list[bool]:
        with urllib.request.urlopen(f"{master_http}/get_all_keys", timeout=timeout_s) as resp:
            pool = set(resp.read().decode().split())
        return [k in pool or (on_disk is not None and on_disk(k)) for k in keys]
    return presence


class StoreAudit:
    """Keys put into the store and not yet found gone. Thread-safe."""

    def __init__(self, max_keys: int = 200_000, batch: int = 4096) -> None:
        self.max_keys, self.batch = max_keys, batch
        self._keys: OrderedDict[str, int] = OrderedDict()  # key -> number of the put that recorded it
        self._puts = 0
        self._dropped: list[str] = []  # pushed out by the cap, reported at the next check
        self._cycle: list[str] = []  # this pass's keys still to check
        self._lock = threading.Lock()
        self.checked = 0
        self.gone = 0

    def put(self, keys: Iterable[str]) -> None:
        """Records keys the store accepted (again); the oldest beyond `max_keys` are dropped."""
        with self._lock:
            for k in keys:
                self._puts += 1
                self._keys[k] = self._puts
                self._keys.move_to_end(k)
            while len(self._keys) > self.max_keys:
                self._dropped.append(self._keys.popitem(last=False)[0])

    def __len__(self) -> int:
        return len(self._keys)

    def check(self, presence: Presence) -> list[str]:
        """Checks the next slice of keys; returns those no tier holds, plus those dropped for
        the cap, and forgets them. `presence` is called without the lock held."""
        with self._lock:
            if not self._cycle:
                self._cycle = list(self._keys)
            todo, self._cycle = self._cycle[:self.batch], self._cycle[self.batch:]
            seen = {k: self._keys[k] for k in todo if k in self._keys}
            gone, self._dropped = self._dropped, []
        if seen:
            held = presence(list(seen))
            self.checked += len(seen)
            with self._lock:
                for (k, put), ok in zip(seen.items(), held):
                    # A key put again while we looked is held, whatever the answer said.
                    if not ok and self._keys.get(k) == put:
                        del self._keys[k]
                        gone.append(k)
        self.gone += len(gone)
        return gone


class AuditedStore:
    """A store handle that remembers accepted puts and reports keys the store lost.

    `presence(keys)` answers whether any tier still holds each key without
    changing anything (`master_presence`);
    `report(keys)` is called from the audit thread with the keys gone.
    """

    def __init__(self, store, presence: Presence, report: Callable[[list[str]], None],
                 interval_s: float = 1.0, audit: StoreAudit | None = None) -> None:
        self._store = store
        self.audit = audit or StoreAudit()
        self._presence, self._report, self.interval_s = presence, report, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="baton-store-audit", daemon=True)
        self._thread.start()

    def __getattr__(self, name):
        return getattr(self._store, name)

    def batch_put_from_multi_buffers(self, keys, all_addrs, all_sizes, *args, **kwargs):
        """Puts through the wrapped store and records the keys it accepted."""
        res = self._store.batch_put_from_multi_buffers(keys, all_addrs, all_sizes, *args, **kwargs)
        self.audit.put(k for k, rc in zip(keys, res) if rc >= 0)
        return res

    def check_now(self) -> list[str]:
        """One audit round: reports and returns the keys found gone."""
        gone = self.audit.check(self._presence)
        if gone:
            self._report(gone)
        return gone

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check_now()
            except Exception as exc:  # noqa: BLE001 - the store may be briefly away; check again
                log.warning("store audit failed: %s", exc)
                time.sleep(self.interval_s)

    def stop(self) -> None:
        """Stops the audit thread (after the round in progress); the store stays open."""
        self._stop.set()

    def close(self, *args, **kwargs):
        """Stops the audit thread and closes the wrapped store."""
        self.stop()
        return self._store.close(*args, **kwargs)
