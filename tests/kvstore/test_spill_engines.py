"""The spill tier with real engines: a prefill/decode pair on a real Mooncake pool.

The pool holds 16 MB; the working set is 48 prompts of ~1 MB of KV each
(three times the pool), so the pool evicts the earliest prompts and only the
spill tier still has them. The spill directory is its own 96 MB tmpfs (when
this machine lets us mount one), so the last test can fill the disk for real.
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
import subprocess
from pathlib import Path

import pytest

from common.config import parse_size
from bench.kv.kv_rig import KVRig, rig_config
from kvstore.holdings import AuditedStore, master_presence
from kvstore.spill import SpillTier, dir_usage

POOL = "16MB"
CAP = "64MB"
PROMPTS = 48
TOKENS = 1000  # 31 full blocks of 32 tokens, 32 KiB each for the tiny model
BLOCKS = TOKENS // 32


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _mount_tmpfs(path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    for prefix in ([], ["sudo", "-n"]):
        if subprocess.run(prefix + ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0:
            return True
    return False


def _umount(path) -> None:
    for prefix in ([], ["sudo", "-n"]):
        if subprocess.run(prefix + ["umount", str(path)], capture_output=True).returncode == 0:
            return


@pytest.fixture(scope="module")
def rig(tmp_path_factory, loop):
    workdir = tmp_path_factory.mktemp("kvrig")
    own_fs = _mount_tmpfs(workdir / "spill", "96m")
    cfg = rig_config(workdir, kv_cache_gb=0.05, global_segment_size=POOL, kv_lease_ttl_ms=500,
                     spill_cap=CAP, spill_min_free="0")
    r = KVRig(cfg, workdir)
    r.own_fs = own_fs
    try:
        loop.run_until_complete(r.start())
        yield r
    finally:
        r.close()
        if own_fs:
            _umount(workdir / "spill")


def _prompt(i: int) -> list[int]:
    rnd = random.Random(i)
    return [rnd.randrange(2, 1000) for _ in range(TOKENS)]


@pytest.fixture(scope="module")
def first_pass(rig, loop):
    """Every prompt once: prefill saves it, decode loads it; the spill files each one added."""
    outs, files = [], []
    seen: set[str] = set()
    for i in range(PROMPTS):
        loop.run_until_complete(rig.prefill(_prompt(i)))
        outs.append(loop.run_until_complete(rig.decode(_prompt(i))))
        loop.run_until_complete(rig.wait_spilled())
        now = rig.spill_files()
        files.append({p: k for p, k in now.items() if p not in seen})
        seen |= set(now)
    return outs, files


def _in_pool(rig, keys) -> int:
    return sum(1 for e in rig.store_client().batch_is_exist(list(keys)) if e == 1)


def test_first_pass_loads_every_prompt_from_the_store(first_pass):
    outs, files = first_pass
    assert PROMPTS * TOKENS * 1024 >= 3 * parse_size(POOL)  # working set: 3x the pool
    assert all(o.cached_tokens == BLOCKS * 32 for o in outs)
    assert all(len(f) == BLOCKS for f in files), [len(f) for f in files]
    # Every key, in the pool and on disk, starts with the model identity digest.
    (identity,) = {Path(p).parents[1].name for f in files for p in f}
    assert all(k.startswith(f"baton-{identity}@") for f in files for k in f.values())


def test_spilling_reads_nothing_back_from_the_pool(rig, loop, first_pass):
    """Write-behind spills the copy taken at put time: store traffic is the puts alone."""
    stats = loop.run_until_complete(rig.spill_stats("prefill"))
    assert stats["saved_bytes"] > 0 and stats.get("pool_reread_bytes", 0) == 0
    assert stats.get("tier_put_bytes", 0) >= stats["saved_bytes"] * 0.9  # and the disk got it all


def test_earliest_prompts_come_back_from_disk_with_identical_output(rig, loop, first_pass):
    outs, files = first_pass
    early = range(4)
    assert all(_in_pool(rig, files[i].values()) == 0 for i in early), "pool still holds early prompts"
    loop.run_until_complete(rig.reset_local_caches())
    before = loop.run_until_complete(rig.spill_stats("decode"))
    for i in early:
        again = loop.run_until_complete(rig.decode(_prompt(i)))
        assert again.cached_tokens == BLOCKS * 32
        assert again.token_ids == outs[i].token_ids
    after = loop.run_until_complete(rig.spill_stats("decode"))
    assert after.get("tier_hits", 0) - before.get("tier_hits", 0) >= len(early) * BLOCKS
    # straight from the files into the engine's buffers, not promoted through the pool
    assert after.get("loaded_from_disk", 0) - before.get("loaded_from_disk", 0) >= len(early) * BLOCKS
    assert after.get("promoted", 0) == before.get("promoted", 0)


def test_a_prefill_engine_puts_what_it_loaded_from_disk_back_into_the_pool(rig, loop, first_pass):
    """Decode engines on other nodes load from the pool, not from this node's disk."""
    outs, files = first_pass
    keys = list(files[5].values())
    client = rig.store_client()
    for key in keys:
        client.remove(key, True)
    assert _in_pool(rig, keys) == 0
    loop.run_until_complete(rig.reset_local_caches())
    before = loop.run_until_complete(rig.spill_stats("prefill"))
    loop.run_until_complete(rig.prefill(_prompt(5)))
    after = loop.run_until_complete(rig.spill_stats("prefill"))
    assert after.get("loaded_from_disk", 0) - before.get("loaded_from_disk", 0) == BLOCKS
    assert after.get("republished", 0) - before.get("republished", 0) == BLOCKS
    assert _in_pool(rig, keys) == BLOCKS


def test_corrupted_spill_objects_are_misses_and_output_is_correct(rig, loop, first_pass):
    outs, files = first_pass
    victim = 6
    client = rig.store_client()
    for key in files[victim].values():
        client.remove(key, True)  # make sure only the disk could serve it
    for n, path in enumerate(sorted(files[victim])):
        with open(path, "r+b") as f:
            if n % 2:
                f.truncate(100)
            else:
                f.seek(-3, 2)
                byte = f.read(1)
                f.seek(-3, 2)
                f.write(bytes([byte[0] ^ 0xFF]))
    loop.run_until_complete(rig.reset_local_caches())
    before = loop.run_until_complete(rig.spill_stats("decode"))
    again = loop.run_until_complete(rig.decode(_prompt(victim)))
    after = loop.run_until_complete(rig.spill_stats("decode"))
    assert again.cached_tokens == 0
    assert again.token_ids == outs[victim].token_ids
    assert after.get("tier_corrupt", 0) - before.get("tier_corrupt", 0) >= 1


def test_disk_cap_is_respected_and_overflow_only_costs_recompute(rig, loop, first_pass):
    outs, files = first_pass
    cap = parse_size(CAP)
    for i in range(PROMPTS, PROMPTS + 40):
        loop.run_until_complete(rig.prefill(_prompt(i)))
        loop.run_until_complete(rig.wait_spilled())
        assert dir_usage(rig.cfg.spill_path())[0] <= cap
    stats = loop.run_until_complete(rig.spill_stats("prefill"))
    assert stats.get("tier_evicted", 0) > 0
    # Prompt 10 was least recently used: gone from disk and pool, it is recomputed, same tokens.
    assert not any(os.path.exists(p) for p in files[10])
    loop.run_until_complete(rig.reset_local_caches())
    again = loop.run_until_complete(rig.decode(_prompt(10)))
    assert again.token_ids == outs[10].token_ids


def test_the_store_audit_reports_what_no_tier_holds(rig, tmp_path):
    """On the real pool: a key the pool dropped is held while the disk has it, and reported
    gone once neither tier has it; keys the pool still has are never reported, and the
    audit takes no read leases (it lists keys on the master)."""
    client = rig.store_client()
    m = rig.cfg.mooncake
    keys = [f"baton-audit-test@{i:064x}" for i in range(4)]
    for k in keys:
        assert client.put(k, os.urandom(4096)) == 0
    tier = SpillTier(tmp_path / "spill", "0" * 32, cap_bytes=1 << 20, rescan_s=0)
    tier.put(keys[1], b"on disk")
    reported: list[str] = []
    presence = master_presence(f"http://{m.host}:{m.master_metrics_port}", tier.contains)
    audited = AuditedStore(client, presence, reported.extend, interval_s=3600)
    try:
        audited.audit.put(keys)
        client.remove(keys[1])  # on disk only: still held
        client.remove(keys[2])  # in no tier
        assert audited.check_now() == [keys[2]] and reported == [keys[2]]
        os.unlink(tier.path(keys[1]))  # evicted by another process:
        tier.refresh()  # gone from the tier's index at its next listing
        assert audited.check_now() == [keys[1]]
        assert audited.check_now() == [] and len(audited.audit) == 2
        assert client.remove(keys[0]) == 0  # no lease held by the audit: removable at once
    finally:
        audited.stop()
        client.remove(keys[3])


def test_full_disk_stops_spilling_and_serving_goes_on(rig, loop):
    if not rig.own_fs:
        pytest.skip("cannot mount a tmpfs here (needs root or passwordless sudo)")
    ballast = rig.cfg.spill_path() / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT)
    try:  # fill the spill filesystem to the last byte
        while True:
            os.write(fd, b"\0" * (1 << 16))
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    try:
        files_before = set(rig.spill_files())
        for i in range(200, 203):
            loop.run_until_complete(rig.prefill(_prompt(i)))
            first = loop.run_until_complete(rig.decode(_prompt(i)))
            assert first.cached_tokens == BLOCKS * 32  # KV still flows through the pool
            loop.run_until_complete(rig.wait_spilled())
            loop.run_until_complete(rig.reset_local_caches())
            assert loop.run_until_complete(rig.decode(_prompt(i))).token_ids == first.token_ids
        stats = loop.run_until_complete(rig.spill_stats("prefill"))
        assert stats.get("tier_disk_full", 0) >= 1
        assert stats.get("skipped_full", 0) + stats.get("tier_skipped_full", 0) >= 1
        assert set(rig.spill_files()) == files_before
        assert not [p for p in rig.cfg.spill_path().rglob("*.tmp")]
    finally:
        ballast.unlink()
