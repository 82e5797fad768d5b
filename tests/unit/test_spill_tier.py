"""The NVMe spill tier on a real directory: integrity, cap, LRU, disk full."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from common.config import ConfigError, load_config, parse_size
from kvstore.identity import ModelIdentity
from kvstore.spill import SpillTier, decode, dir_usage, encode, read_key

ID_A = "a" * 32
ID_B = "b" * 32


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def tier(tmp_path, cap=1 << 20, **kw):
    return SpillTier(tmp_path / "spill", ID_A, cap_bytes=cap, **kw)


def test_round_trip_and_key_recorded(tmp_path):
    t = tier(tmp_path)
    assert t.put("k1", b"x" * 1000)
    assert t.get("k1") == b"x" * 1000
    assert read_key(t.path("k1")) == "k1"
    assert t.get("absent") is None
    assert t.stats["hits"] == 1 and t.stats["misses"] == 1


def test_other_identity_or_key_never_decodes():
    ident_a, ident_b = bytes.fromhex(ID_A), bytes.fromhex(ID_B)
    blob = encode(ident_a, "k", b"payload")
    assert decode(blob, ident_a, "k") == b"payload"
    assert decode(blob, ident_b, "k") is None
    assert decode(blob, ident_a, "other") is None


def test_other_identity_does_not_even_find_the_file(tmp_path):
    a = tier(tmp_path)
    b = SpillTier(tmp_path / "spill", ID_B, cap_bytes=1 << 20)
    a.put("k", b"kv of model a")
    assert not b.contains("k") and b.get("k") is None


@pytest.mark.parametrize("damage", ["truncate", "flip_payload", "flip_header", "empty"])
def test_damaged_object_is_a_miss_and_removed(tmp_path, damage):
    t = tier(tmp_path)
    t.put("k", bytes(range(256)) * 8)
    p = t.path("k")
    blob = bytearray(p.read_bytes())
    if damage == "truncate":
        blob = blob[: len(blob) // 2]
    elif damage == "flip_payload":
        blob[-5] ^= 0x40
    elif damage == "flip_header":
        blob[9] ^= 0x01
    else:
        blob = bytearray()
    p.write_bytes(bytes(blob))
    assert t.get("k") is None
    assert t.stats["corrupt"] == 1
    assert not p.exists()


def test_cap_is_respected_and_least_recently_used_goes_first(tmp_path):
    t = tier(tmp_path, cap=100_000, rescan_s=0)
    payload = b"v" * 9_000
    for i in range(8):
        assert t.put(f"k{i}", payload)
        os.utime(t.path(f"k{i}"), (1000 + i, 1000 + i))  # deterministic age order
    t.get("k0")  # now the most recently used
    for i in range(8, 12):
        assert t.put(f"k{i}", payload)
    assert t.stats["evicted"] > 0
    assert t.contains("k0") and not t.contains("k1") and not t.contains("k2")
    for i in range(12, 40):
        assert t.put(f"k{i}", payload)
        assert dir_usage(tmp_path / "spill")[0] <= 100_000


def test_object_larger_than_the_cap_is_refused(tmp_path):
    t = tier(tmp_path, cap=1000)
    assert not t.put("big", b"z" * 5000)
    assert t.stats["too_large"] == 1 and dir_usage(tmp_path / "spill") == (0, 0)


def test_free_space_floor_pauses_spilling(tmp_path):
    clock = Clock()
    t = tier(tmp_path, min_free_bytes=1 << 62, clock=clock)  # more than any disk has
    assert not t.put("k", b"v")
    assert t.full and t.stats["disk_full"] == 1
    assert not t.put("k2", b"v") and t.stats["skipped_full"] == 2


_FILL_SCRIPT = """
import resource, signal, sys
from kvstore.spill import SpillTier
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
class Clock:
    t = 0.0
    def __call__(self): return self.t
clock = Clock()
t = SpillTier(sys.argv[1], "a" * 32, cap_bytes=1 << 30, full_backoff_s=30, clock=clock)
ok_small = t.put("small", b"s" * 100)
failed_big = not t.put("big", b"b" * 100_000)
full = t.full
skipped = not t.put("small2", b"s" * 100)
clock.t = 31
after_backoff = t.put("small3", b"s" * 100)
print(ok_small, failed_big, full, skipped, after_backoff, t.stats["disk_full"], t.get("small") == b"s" * 100)
"""


def test_disk_full_stops_spilling_then_resumes(tmp_path):
    """A real write failure (EFBIG from RLIMIT_FSIZE): no exception, spilling pauses, reads go on."""
    out = subprocess.run([sys.executable, "-c", _FILL_SCRIPT, str(tmp_path / "spill")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True", "True", "True", "1", "True"]
    leftovers = [p for p in (tmp_path / "spill").rglob("*.tmp")]
    assert leftovers == []


def test_stale_temp_files_are_swept(tmp_path):
    t = tier(tmp_path, rescan_s=0)
    stale = t.dir / "ab" / ".x.kv.1.2.tmp"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"half")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    t.refresh()  # the directory listing sweeps them
    assert not stale.exists()


def test_identity_digest_covers_every_field():
    base = ModelIdentity("m@1", "float32", "auto", 32, 2, 2, 32, "FullAttentionSpec:l0,l1", "tp1pp1")
    variants = [replace(base, model="m@2"), replace(base, dtype="bfloat16"),
                replace(base, kv_cache_dtype="fp8"), replace(base, block_size=16),
                replace(base, num_layers=3), replace(base, num_kv_heads=4), replace(base, head_dim=64),
                replace(base, layer_layout="SlidingWindowSpec:l0,l1"), replace(base, parallel="tp2pp1")]
    digests = {v.digest for v in variants} | {base.digest}
    assert len(digests) == len(variants) + 1
    assert len(base.digest) == 32


def test_parse_size():
    assert parse_size("512MB") == 512 * 10**6
    assert parse_size("16GiB") == 16 * 2**30
    assert parse_size("1048576") == 1048576
    with pytest.raises(ValueError):
        parse_size("lots")


def test_bad_spill_cap_names_field_and_file(tmp_path):
    p = tmp_path / "baton.yaml"
    p.write_text("mooncake:\n  spill_cap: huge\n")
    with pytest.raises(ConfigError) as e:
        load_config(p, environ={})
    assert "mooncake.spill_cap" in str(e.value) and str(p) in str(e.value)


def test_bench_kv_raw_bandwidths_measure_real_transfers(tmp_path):
    from bench.kv.kv import disk_sequential_read, loopback_tcp_bandwidth

    assert loopback_tcp_bandwidth(total=8 << 20) > 1e6
    assert disk_sequential_read(tmp_path, total=8 << 20) > 1e6
    assert list(tmp_path.iterdir()) == []
