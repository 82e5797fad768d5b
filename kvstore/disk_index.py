"""What the spill directory holds, kept in memory, so a lookup of a listed key reads no disk.

`DiskIndex` maps an object's file name to its size and last use, in
least-recently-used order, and keeps the total size. The spill tier
(kvstore/spill.py) updates it on every write, hit and removal of its own,
and reconciles it with a listing of the directory every few seconds, which
is how it learns of files other processes wrote (the decode engines read what
the prefill engines spilled; with a shared directory, other nodes' engines
too) and of files they evicted.

Pure bookkeeping: no file system, Ray or torch; time is passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator


class DiskIndex:
    """File name -> (size, last use); the oldest use first. Not thread-safe (the tier locks)."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def size(self, name: str) -> int | None:
        entry = self._entries.get(name)
        return entry[0] if entry else None

    def add(self, name: str, size: int, used: float) -> None:
        """Records `name` (again) as `size` bytes used at `used`, the newest use."""
        self.remove(name)
        self._entries[name] = (int(size), used)
        self.bytes += int(size)

    def touch(self, name: str, used: float) -> None:
        """Marks `name` used at `used` (the newest use); unknown names are ignored."""
        entry = self._entries.pop(name, None)
        if entry is not None:
            self._entries[name] = (entry[0], max(entry[1], used))

    def remove(self, name: str) -> int:
        """Forgets `name`; returns its size (0 if it was not known)."""
        entry = self._entries.pop(name, None)
        if entry is None:
            return 0
        self.bytes -= entry[0]
        return entry[0]

    def oldest(self) -> Iterator[tuple[str, int, float]]:
        """(name, size, last use), least recently used first; a snapshot, safe to change the index while iterating."""
        return iter([(n, s, u) for n, (s, u) in self._entries.items()])

    def reconcile(self, listed: set[str], known_sizes: dict[str, tuple[int, float]]) -> tuple[int, int]:
        """Brings the index in line with a listing of the directory.

        `listed` is every object file name the listing found; `known_sizes`
        gives (size, mtime) of the listed names this index did not know
        (the caller stats only those). Names the listing lacks are forgotten
        (another process evicted them); new ones are inserted by mtime among
        the others, so another process's old files are evicted before this
        one's recent ones. Returns (added, dropped).
        """
        dropped = [n for n in self._entries if n not in listed]
        for n in dropped:
            self.remove(n)
        added = 0
        for name, (size, mtime) in sorted(known_sizes.items(), key=lambda kv: kv[1][1]):
            if name in self._entries or name not in listed:
                continue
            self._insert_by_age(name, size, mtime)
            added += 1
        return added, len(dropped)

    def missing_from(self, listed: set[str]) -> set[str]:
        """Listed names this index does not know (the ones a reconcile needs sizes for)."""
        return {n for n in listed if n not in self._entries}

    def _insert_by_age(self, name: str, size: int, used: float) -> None:
        if not self._entries or next(reversed(self._entries.values()))[1] <= used:
            self._entries[name] = (int(size), used)  # the usual case: a file just written elsewhere
            self.bytes += int(size)
            return
        newer = [(n, e) for n, e in self._entries.items() if e[1] > used]
        for n, _ in newer:
            self._entries.pop(n)
        self._entries[name] = (int(size), used)
        self.bytes += int(size)
        for n, e in newer:
            self._entries[n] = e
