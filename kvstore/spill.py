"""Baton's NVMe spill tier: KV objects as checked files under a size cap.

Mooncake's own SSD offload (0.3.13) writes nothing to disk once the memory
pool evicts, and serves no read-back, so evicted KV is simply gone
(docs/architecture.md shows the experiment). This tier closes the gap: every
object the memory pool accepts is also written here (see spill_store.py), and
a lookup that misses memory but hits here is loaded back.

Layout: `<root>/<identity>/<aa>/<digest>.kv`, where `identity` is the model
identity digest (kvstore/identity.py) and `digest` hashes the identity and the
store key; kvstore/spill_format.py has the file format, whose checksum covers
identity, key and payload. Anything that does not
match (wrong identity, other key, truncated, flipped bits) is a miss and the
file is removed.

What the directory holds is kept in memory (kvstore/disk_index.py), so
`contains` never touches the disk (`probe` stats a key the index lacks); a
background listing every `rescan_s` picks up what other processes wrote or
evicted. Put the directory on a
filesystem every node mounts and the engines of every node share one tier
(docs/architecture.md, "Spill across nodes"). Reads go straight into the
caller's buffers (`read_into`, one `preadv` per object), several objects at a
time. The directory has a byte cap with least-recently-used eviction (a hit
sets the file's mtime, so processes sharing the directory agree on age), a
free-space floor, and stops spilling for a while when a write fails because
the disk is full. No Ray, vLLM or torch imports.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from kvstore.disk_index import DiskIndex
from kvstore.spill_format import (  # noqa: F401 - encode, decode, read_key: the format's API, used from here
    HEAD, MAGIC, checksum, decode, dir_usage, encode, header, read_key, walk_objects,
)

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_TMP_MAX_AGE_S = 300
READERS = 4  # objects read at once: a disk serves several outstanding reads faster than one


class SpillTier:
    """A capped, checked, file-per-object KV tier under one directory.

    Thread-safe; several processes (and, on a shared filesystem, nodes) may
    share the directory. Each keeps an index of the directory in memory,
    refreshed by a listing every `rescan_s` on a background thread (0: only
    when `refresh()` is called).
    """

    def __init__(self, root: str | os.PathLike, identity: str, cap_bytes: int,
                 min_free_bytes: int = 0, full_backoff_s: float = 30.0,
                 rescan_s: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.root = Path(root)
        self.identity = bytes.fromhex(identity)[:16].ljust(16, b"\0")
        self.dir = self.root / identity[:32]
        self.cap_bytes = int(cap_bytes)
        self.min_free_bytes = int(min_free_bytes)
        self.full_backoff_s = full_backoff_s
        self.rescan_s = rescan_s
        self.clock, self.wall = clock, wall
        self.stats: Counter[str] = Counter()
        self.index = DiskIndex()
        self._lock = threading.Lock()
        self._full_until = float("-inf")
        self._readers = ThreadPoolExecutor(READERS, thread_name_prefix="baton-spill-read")
        self._stop = threading.Event()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.refresh()
        if rescan_s > 0:
            threading.Thread(target=self._rescan_loop, name="baton-spill-scan", daemon=True).start()

    # -- addressing -------------------------------------------------------
    def _name(self, key: str) -> str:
        return hashlib.blake2b(self.identity + key.encode(), digest_size=16).hexdigest()

    def _file(self, name: str) -> Path:
        return self.dir / name[:2] / f"{name}.kv"

    def path(self, key: str) -> Path:
        return self._file(self._name(key))

    def contains(self, key: str) -> bool:
        """Whether the index lists an object for `key` (not yet verified); reads no disk, changes nothing."""
        with self._lock:
            return self._name(key) in self.index

    def probe(self, key: str) -> bool:
        """`contains`, or, for a key the index does not list, whether its file exists (one
        `stat`): another process may have written it since the last listing. A file found
        is added to the index."""
        name = self._name(key)
        with self._lock:
            if name in self.index:
                return True
            self.stats["probes"] += 1
        try:
            st = os.stat(self._file(name))
        except OSError:
            return False
        with self._lock:
            self.index.add(name, st.st_size, st.st_mtime)
            self.stats["probe_hits"] += 1
        return True

    def _count(self, **counts: int) -> None:
        with self._lock:
            self.stats.update(counts)

    # -- reads ------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        """The payload for `key`, or None on a miss (see `read_into`)."""
        buf: list[bytearray] = []
        n = self._read(key, lambda size: buf.append(bytearray(size)) or [memoryview(buf[0])])
        return bytes(buf[0]) if n is not None else None

    def read_into(self, key: str, buffers: list[memoryview]) -> int | None:
        """Reads `key`'s payload straight into `buffers` (in order; their sizes must add up
        to the payload's); returns its size, or None on a miss (also when the sizes differ).

        A hit marks the object recently used. An unsound file (truncated,
        corrupted, another identity, key or size) is deleted and counted
        `corrupt`; the buffers' contents are then undefined.
        """
        want = sum(len(b) for b in buffers)
        return self._read(key, lambda size: buffers if size == want else None)

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """`get` of several keys, read concurrently."""
        return list(self._readers.map(self.get, keys))

    def read_many_into(self, items: list[tuple[str, list[memoryview]]]) -> list[int | None]:
        """`read_into` of several (key, buffers), read concurrently."""
        return list(self._readers.map(lambda item: self.read_into(*item), items))

    def _read(self, key: str, target: Callable[[int], list[memoryview] | None]) -> int | None:
        name, k = self._name(key), key.encode()
        p = self._file(name)
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:
            with self._lock:
                self.index.remove(name)
                self.stats["misses"] += 1
            return None
        except OSError:
            self._count(read_errors=1)
            return None
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, HEAD.size + len(k), 0)
            payload = self._check_head(head, k, size)
            buffers = target(payload) if payload is not None else None
            if payload is not None and buffers is None:
                self._count(size_mismatch=1)  # the caller expects another size: a miss, the file stays
                return None
            if buffers is None or not _pread_full(fd, buffers, HEAD.size + len(k)) \
                    or checksum(self.identity, k, list(buffers)) != head[HEAD.size - 16:HEAD.size]:
                self._count(corrupt=1)
                self._drop(name, p)
                return None
        except OSError:
            self._count(read_errors=1)
            return None
        finally:
            os.close(fd)
        try:
            os.utime(p)  # the last use, for processes sharing the directory
        except OSError:
            pass
        with self._lock:
            self.index.touch(name, self.wall())
            self.stats["hits"] += 1
            self.stats["hit_bytes"] += payload
        return payload

    def _check_head(self, head: bytes, key: bytes, size: int) -> int | None:
        """The payload size a sound header announces for `key` in a file of `size` bytes, else None."""
        if len(head) < HEAD.size + len(key):
            return None
        magic, ident, klen, plen, _ = HEAD.unpack_from(head)
        if magic != MAGIC or ident != self.identity or klen != len(key) or head[HEAD.size:] != key \
                or size != HEAD.size + klen + plen:
            return None
        return plen

    # -- writes -----------------------------------------------------------
    @property
    def full(self) -> bool:
        """True while spilling is paused after the disk filled up."""
        return self.clock() < self._full_until

    def put(self, key: str, payload: bytes | memoryview | list[memoryview]) -> bool:
        """Writes `key` (atomically: temp file + rename), evicting LRU files to stay under the cap;
        a list payload is written part after part.

        Returns False, writing nothing, while the disk is full or below the
        free-space floor, or if the object alone exceeds the cap.
        """
        name, k = self._name(key), key.encode()
        parts = payload if isinstance(payload, list) else [payload]
        head = header(self.identity, k, parts)
        size = len(head) + sum(len(p) for p in parts)
        if size > self.cap_bytes:
            self._count(too_large=1)
            return False
        if self.full or self._below_floor(size):
            self._count(skipped_full=1)
            return False
        self._make_room(size)
        p = self._file(name)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            p.parent.mkdir(exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(head)
                for part in parts:
                    f.write(part)
            os.replace(tmp, p)
        except OSError as exc:
            _remove(tmp)
            if exc.errno in _FULL_ERRNOS:
                self._full_until = self.clock() + self.full_backoff_s
                self._count(disk_full=1)
            else:
                self._count(write_errors=1)
            return False
        with self._lock:
            self.index.add(name, size, self.wall())
            self.stats["puts"] += 1
            self.stats["put_bytes"] += size - len(head)
        return True

    def _below_floor(self, size: int) -> bool:
        if not self.min_free_bytes:
            return False
        try:
            free = shutil.disk_usage(self.dir).free
        except OSError:
            return True
        if free - size < self.min_free_bytes:
            self._full_until = self.clock() + self.full_backoff_s
            self._count(disk_full=1)
            return True
        return False

    def _make_room(self, size: int) -> None:
        """Evicts least recently used files until `size` more bytes fit under 90% of the cap.

        A file another process used since this index last saw it (a newer
        mtime) is kept and moves up the order instead."""
        with self._lock:
            if self.index.bytes + size <= self.cap_bytes:
                return
            target = int(self.cap_bytes * 0.9) - size
            for name, fsize, used in self.index.oldest():
                if self.index.bytes <= target:
                    break
                p = self._file(name)
                try:
                    mtime = os.stat(p).st_mtime
                except FileNotFoundError:
                    self.index.remove(name)
                    continue
                if mtime > used + 1.0:
                    self.index.touch(name, mtime)
                    continue
                self.index.remove(name)
                if _remove(p):
                    self.stats["evicted"] += 1
                    self.stats["evicted_bytes"] += fsize

    def _drop(self, name: str, p: Path) -> None:
        _remove(p)
        with self._lock:
            self.index.remove(name)

    # -- the directory listing --------------------------------------------
    def refresh(self) -> None:
        """Reconciles the index with a listing of the directory (stats only files it did not
        know), and removes temp files writers left behind when they died."""
        listed: set[str] = set()
        stale_before = time.time() - _TMP_MAX_AGE_S
        try:
            subdirs = [e.path for e in os.scandir(self.dir) if e.is_dir()]
        except FileNotFoundError:
            subdirs = []
        for sub in subdirs:
            try:
                entries = list(os.scandir(sub))
            except FileNotFoundError:
                continue
            for e in entries:
                if e.name.endswith(".kv") and not e.name.startswith("."):
                    listed.add(e.name[:-3])
                elif e.name.endswith(".tmp"):
                    _sweep_if_older(e.path, stale_before)
        with self._lock:
            new = self.index.missing_from(listed)
        sizes = {}
        for name in new:
            try:
                st = os.stat(self._file(name))
            except FileNotFoundError:
                continue
            sizes[name] = (st.st_size, st.st_mtime)
        with self._lock:
            added, dropped = self.index.reconcile(listed, sizes)
            self.stats["scans"] += 1
            self.stats["scan_added"] += added
            self.stats["scan_dropped"] += dropped

    def _rescan_loop(self) -> None:
        """Lists the directory every `rescan_s`, or less often on a directory so large that
        listing it takes more than 5% of that time (a listing then waits 20× its duration)."""
        wait = self.rescan_s
        while not self._stop.wait(wait):
            t0 = time.monotonic()
            try:
                self.refresh()
            except OSError:
                self._count(scan_errors=1)
            wait = next_listing_wait(self.rescan_s, time.monotonic() - t0)

    def usage(self) -> int:
        """Bytes of spill files under the root, scanned now."""
        return dir_usage(self.root)[0]

    def close(self) -> None:
        """Stops the background listing and the readers."""
        self._stop.set()
        self._readers.shutdown(wait=False)


def next_listing_wait(period_s: float, took_s: float) -> float:
    """Seconds until the next directory listing: `period_s`, or 20× what the last one took."""
    return max(period_s, 20 * took_s)


def _pread_full(fd: int, buffers: list[memoryview], offset: int) -> bool:
    """Fills `buffers` from `fd` at `offset` (one preadv, then per buffer after a short read)."""
    want = sum(len(b) for b in buffers)
    if os.preadv(fd, buffers, offset) == want:
        return True
    for b in buffers:
        got = 0
        while got < len(b):
            n = os.preadv(fd, [b[got:]], offset + got)
            if n <= 0:
                return False
            got += n
        offset += len(b)
    return True


def _sweep_if_older(path: str, cutoff: float) -> None:
    try:
        if os.stat(path).st_mtime < cutoff:
            _remove(path)
    except FileNotFoundError:
        pass


def _remove(path) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
