"""Baton's NVMe spill tier: KV objects as checked files under a size cap.

Mooncake's own SSD offload (0.3.13) writes nothing to disk once the memory
pool evicts, and serves no read-back, so evicted KV is simply gone
(docs/architecture.md shows the experiment). This tier closes the gap: every
object the memory pool accepts is also written here (see spill_store.py), and
a lookup that misses memory but hits here is loaded back.

Layout: `<root>/<identity>/<aa>/<digest>.kv`, where `identity` is the model
identity digest (kvstore/identity.py) and `digest` hashes the identity and the
store key. A file is

    magic(8) | identity(16) | key_len u32 | payload_len u64 | blake2b-16 | key | payload

and the checksum covers identity, key and payload. Anything that does not
match (wrong identity, other key, truncated, flipped bits) is a miss and the
file is removed.

The directory has a byte cap with least-recently-used eviction (file mtime is
the last use, so several processes sharing the directory agree), a free-space
floor, and stops spilling for a while when a write fails because the disk is
full. No Ray, vLLM or torch imports; `clock` is passed in.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import struct
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable

MAGIC = b"BATONKV1"
_HEAD = struct.Struct("<8s16sIQ16s")
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_TMP_MAX_AGE_S = 300


def _checksum(identity: bytes, key: bytes, payload: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(identity)
    h.update(key)
    h.update(payload)
    return h.digest()


def encode(identity: bytes, key: str, payload: bytes) -> bytes:
    """The bytes of one spill file."""
    k = key.encode()
    return _HEAD.pack(MAGIC, identity, len(k), len(payload), _checksum(identity, k, payload)) + k + payload


def decode(blob: bytes, identity: bytes, key: str) -> bytes | None:
    """The payload of a spill file, or None if it is not a sound object for (identity, key)."""
    if len(blob) < _HEAD.size:
        return None
    magic, ident, klen, plen, csum = _HEAD.unpack_from(blob)
    k = key.encode()
    if magic != MAGIC or ident != identity or len(blob) != _HEAD.size + klen + plen:
        return None
    got_key = blob[_HEAD.size:_HEAD.size + klen]
    payload = blob[_HEAD.size + klen:]
    if got_key != k or _checksum(ident, got_key, payload) != csum:
        return None
    return payload


def read_key(path: Path) -> str | None:
    """The store key recorded in a spill file's header (for tools and tests)."""
    with open(path, "rb") as f:
        head = f.read(_HEAD.size)
        if len(head) < _HEAD.size or head[:8] != MAGIC:
            return None
        klen = _HEAD.unpack(head)[2]
        return f.read(klen).decode(errors="replace")


def dir_usage(root: Path) -> tuple[int, int]:
    """(bytes, objects) of the spill files under `root`; reads only."""
    total = count = 0
    for path, size, _ in walk_objects(root):
        total += size
        count += 1
    return total, count


def walk_objects(root: Path):
    """(path, size, mtime) of every spill file under root, tolerating races."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".kv"):
                continue
            p = os.path.join(dirpath, name)
            try:
                st = os.stat(p)
            except FileNotFoundError:
                continue
            yield p, st.st_size, st.st_mtime


class SpillTier:
    """A capped, checked, file-per-object KV tier under one directory.

    Thread-safe; several processes may share the directory (each keeps an
    estimate of its size and rescans every `rescan_s`).
    """

    def __init__(self, root: str | os.PathLike, identity: str, cap_bytes: int,
                 min_free_bytes: int = 0, full_backoff_s: float = 30.0,
                 rescan_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.root = Path(root)
        self.identity = bytes.fromhex(identity)[:16].ljust(16, b"\0")
        self.dir = self.root / identity[:32]
        self.cap_bytes = int(cap_bytes)
        self.min_free_bytes = int(min_free_bytes)
        self.full_backoff_s = full_backoff_s
        self.rescan_s = rescan_s
        self.clock = clock
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._usage = 0
        self._scanned_at = float("-inf")
        self._full_until = float("-inf")
        self.dir.mkdir(parents=True, exist_ok=True)

    # -- addressing -------------------------------------------------------
    def path(self, key: str) -> Path:
        d = hashlib.blake2b(self.identity + key.encode(), digest_size=16).hexdigest()
        return self.dir / d[:2] / f"{d}.kv"

    def contains(self, key: str) -> bool:
        """Whether a file exists for `key` (not yet verified); changes nothing."""
        return self.path(key).exists()

    # -- reads ------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        """The payload for `key`, or None on a miss.

        A hit marks the object recently used. An unsound file (truncated,
        corrupted, another identity or key) is deleted and counted `corrupt`.
        """
        p = self.path(key)
        try:
            blob = p.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            self.stats["misses"] += 1
            return None
        except OSError:
            self.stats["read_errors"] += 1
            return None
        payload = decode(blob, self.identity, key)
        if payload is None:
            self.stats["corrupt"] += 1
            self._unlink(p, len(blob))
            return None
        try:
            os.utime(p)
        except OSError:
            pass
        self.stats["hits"] += 1
        self.stats["hit_bytes"] += len(payload)
        return payload

    # -- writes -----------------------------------------------------------
    @property
    def full(self) -> bool:
        """True while spilling is paused after the disk filled up."""
        return self.clock() < self._full_until

    def put(self, key: str, payload: bytes) -> bool:
        """Writes `key` (atomically: temp file + rename), evicting LRU files to stay under the cap.

        Returns False, writing nothing, while the disk is full or below the
        free-space floor, or if the object alone exceeds the cap.
        """
        blob = encode(self.identity, key, payload)
        if len(blob) > self.cap_bytes:
            self.stats["too_large"] += 1
            return False
        if self.full or self._below_floor(len(blob)):
            self.stats["skipped_full"] += 1
            return False
        self._make_room(len(blob))
        p = self.path(key)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            p.parent.mkdir(exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(blob)
            os.replace(tmp, p)
        except OSError as exc:
            _remove(tmp)
            if exc.errno in _FULL_ERRNOS:
                self._full_until = self.clock() + self.full_backoff_s
                self.stats["disk_full"] += 1
            else:
                self.stats["write_errors"] += 1
            return False
        with self._lock:
            self._usage += len(blob)
        self.stats["puts"] += 1
        self.stats["put_bytes"] += len(payload)
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
            self.stats["disk_full"] += 1
            return True
        return False

    def _make_room(self, size: int) -> None:
        with self._lock:
            now = self.clock()
            if now - self._scanned_at >= self.rescan_s or self._usage + size > self.cap_bytes:
                files = list(walk_objects(self.root))
                self._usage = sum(s for _, s, _ in files)
                self._scanned_at = now
                if self._usage + size > self.cap_bytes:
                    self._evict(files, target=int(self.cap_bytes * 0.9) - size)
                self._sweep_tmp()

    def _evict(self, files: list, target: int) -> None:
        for path, size, _ in sorted(files, key=lambda f: f[2]):
            if self._usage <= target:
                break
            if _remove(path):
                self.stats["evicted"] += 1
                self.stats["evicted_bytes"] += size
            self._usage -= size

    def _sweep_tmp(self) -> None:
        """Removes temp files that writers left behind when they died."""
        cutoff = time.time() - _TMP_MAX_AGE_S
        for dirpath, _, files in os.walk(self.dir):
            for name in files:
                if name.endswith(".tmp"):
                    p = os.path.join(dirpath, name)
                    try:
                        if os.stat(p).st_mtime < cutoff:
                            _remove(p)
                    except FileNotFoundError:
                        pass

    def _unlink(self, p: Path, size: int) -> None:
        if _remove(p):
            with self._lock:
                self._usage = max(0, self._usage - size)

    def usage(self) -> int:
        """Bytes of spill files under the root, scanned now."""
        return dir_usage(self.root)[0]


def _remove(path) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
