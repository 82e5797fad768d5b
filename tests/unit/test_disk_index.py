"""The spill tier's in-memory index: pure bookkeeping, and the tier's use of it on a real directory."""

from __future__ import annotations

import ctypes
import os

from kvstore.disk_index import DiskIndex
from kvstore.spill import SpillTier

ID = "c" * 32


def test_lru_order_sizes_and_total():
    ix = DiskIndex()
    ix.add("a", 10, used=1.0)
    ix.add("b", 20, used=2.0)
    ix.add("c", 30, used=3.0)
    ix.touch("a", used=4.0)
    assert [n for n, _, _ in ix.oldest()] == ["b", "c", "a"]
    assert ix.bytes == 60 and len(ix) == 3 and ix.size("b") == 20
    assert ix.remove("b") == 20 and ix.remove("b") == 0 and ix.bytes == 40
    ix.add("c", 5, used=5.0)  # rewritten: new size, newest use
    assert ix.bytes == 15 and [n for n, _, _ in ix.oldest()] == ["a", "c"]
    ix.touch("zz", used=9.0)  # unknown: ignored
    assert "zz" not in ix


def test_reconcile_drops_vanished_files_and_inserts_foreign_ones_by_age():
    ix = DiskIndex()
    for i, name in enumerate(("a", "b", "c")):
        ix.add(name, 1, used=10.0 * (i + 1))  # a@10 b@20 c@30
    listed = {"a", "c", "old", "new"}
    assert ix.missing_from(listed) == {"old", "new"}
    added, dropped = ix.reconcile(listed, {"old": (7, 5.0), "new": (9, 40.0)})
    assert (added, dropped) == (2, 1)
    assert [n for n, _, _ in ix.oldest()] == ["old", "a", "c", "new"]
    assert ix.bytes == 1 + 1 + 7 + 9


def test_lookups_read_the_index_and_a_listing_brings_other_writers_files(tmp_path):
    mine = SpillTier(tmp_path, ID, cap_bytes=1 << 20, rescan_s=0)
    other = SpillTier(tmp_path, ID, cap_bytes=1 << 20, rescan_s=0)  # another process or node
    assert other.put("k", b"kv" * 100)
    assert not mine.contains("k")  # not listed yet: a lookup does not go to the disk
    mine.refresh()
    assert mine.contains("k") and mine.get("k") == b"kv" * 100
    os.unlink(other.path("k"))  # evicted elsewhere
    assert mine.contains("k")
    assert mine.get("k") is None and not mine.contains("k")  # the failed read corrects the index
    assert other.contains("k")
    other.refresh()
    assert not other.contains("k") and other.stats["scan_dropped"] == 1


def test_read_into_scatters_the_payload_into_several_buffers(tmp_path):
    t = SpillTier(tmp_path, ID, cap_bytes=1 << 20, rescan_s=0)
    payload = bytes(range(256)) * 40
    assert t.put("k", payload)
    raw = [ctypes.create_string_buffer(n) for n in (1000, 4000, 5240)]
    views = [memoryview((ctypes.c_char * len(r)).from_address(ctypes.addressof(r))).cast("B") for r in raw]
    assert t.read_into("k", views) == len(payload)
    assert b"".join(r.raw for r in raw) == payload
    assert t.read_into("k", views[:2]) is None  # other sizes: a miss, the file stays
    assert t.stats["size_mismatch"] == 1 and t.contains("k")
    many = t.read_many_into([("k", views), ("absent", views)])
    assert many == [len(payload), None]
    assert t.get_many(["k", "absent"]) == [payload, None]


def test_a_corrupted_object_read_into_buffers_is_a_miss_and_removed(tmp_path):
    t = SpillTier(tmp_path, ID, cap_bytes=1 << 20, rescan_s=0)
    t.put("k", b"x" * 4096)
    p = t.path("k")
    blob = bytearray(p.read_bytes())
    blob[-1] ^= 1
    p.write_bytes(bytes(blob))
    assert t.read_into("k", [memoryview(bytearray(4096))]) is None
    assert t.stats["corrupt"] == 1 and not p.exists() and not t.contains("k")


def test_eviction_follows_the_index_and_spares_files_others_used(tmp_path):
    t = SpillTier(tmp_path, ID, cap_bytes=50_000, rescan_s=0)
    for i in range(4):
        assert t.put(f"k{i}", b"v" * 10_000)
    later = os.stat(t.path("k0")).st_mtime + 100
    os.utime(t.path("k0"), (later, later))  # another process read k0 since
    assert t.put("k4", b"v" * 10_000) and t.put("k5", b"v" * 10_000)
    assert t.contains("k0") and not t.contains("k1")
    assert t.index.bytes <= 50_000 and t.index.bytes == t.usage()


def test_the_background_listing_runs_by_itself(tmp_path):
    import time

    mine = SpillTier(tmp_path, ID, cap_bytes=1 << 20, rescan_s=0.05)
    other = SpillTier(tmp_path, ID, cap_bytes=1 << 20, rescan_s=0)
    other.put("k", b"v")
    deadline = time.monotonic() + 5
    while not mine.contains("k") and time.monotonic() < deadline:
        time.sleep(0.02)
    mine.close()
    assert mine.contains("k")


def test_a_slow_listing_spaces_out_the_next_one():
    from kvstore.spill import next_listing_wait

    assert next_listing_wait(2.0, 0.01) == 2.0  # a small directory: every period
    assert next_listing_wait(2.0, 0.5) == 10.0  # listing costs at most 5% of a core


def test_a_probe_finds_a_file_written_since_the_last_listing(tmp_path):
    mine = SpillTier(tmp_path, ID, cap_bytes=1 << 20, rescan_s=0)
    other = SpillTier(tmp_path, ID, cap_bytes=1 << 20, rescan_s=0)
    other.put("k", [memoryview(b"ab"), memoryview(b"cd")])  # written part after part
    assert not mine.contains("k") and mine.probe("k") and mine.contains("k")
    assert mine.get("k") == b"abcd"
    assert not mine.probe("absent") and mine.stats["probes"] == 2 and mine.stats["probe_hits"] == 1
