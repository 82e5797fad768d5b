"""`baton bench kv`: loading a prefix from the memory tier, from the disk tier, or recomputing it.

One run starts a real Mooncake master and store and a prefill/decode engine
pair with Baton's connector (bench/kv/kv_rig.py). For each prefix length it
measures, interleaved, the decode engine's time to first token when

- recompute: the prefix is in no tier, the engine computes it;
- memory: the prefill engine saved it, the decode engine loads it from the pool;
- disk: its keys are removed from the pool and its spill files dropped from
  the page cache, so the decode engine reads them from disk into its KV
  buffers.

Both engines' own prefix caches are emptied before every measurement. The
tiers' read rates are the decode worker's own (bytes loaded over the seconds
its pool and disk loads took, kvstore/spill_store.py's counters); next to
them it measures, in the same run, raw loopback TCP bandwidth and the disk's
sequential read bandwidth, and over the whole run the store traffic per byte
of KV saved. Prints a table and one JSON line; writes JSON and a plot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

from common.constants import REPO_ROOT
from bench.common.stack import bench_workdir
from bench.kv.kv_rig import KVRig, rig_config
from kvstore.spill import READERS

MODELS = REPO_ROOT / "models"


def loopback_tcp_bandwidth(total: int = 512 << 20, chunk: int = 1 << 20) -> float:
    """Bytes/s of one TCP stream over 127.0.0.1 (sender thread to receiver)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    buf = b"\0" * chunk

    def send():
        with socket.create_connection(srv.getsockname()) as c:
            for _ in range(total // chunk):
                c.sendall(buf)

    t = threading.Thread(target=send)
    t.start()
    conn, _ = srv.accept()
    got, t0 = 0, time.perf_counter()
    view = bytearray(chunk)
    while got < total:
        n = conn.recv_into(view)
        if not n:
            break
        got += n
    dt = time.perf_counter() - t0
    t.join()
    conn.close()
    srv.close()
    return got / dt


def drop_page_cache(path: str) -> None:
    """Writes `path` back and evicts its pages from the page cache (no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def disk_sequential_read(directory: Path, total: int = 512 << 20, chunk: int = 1 << 20, streams: int = 1) -> float:
    """Bytes/s reading freshly written, fsynced files after dropping them from the page cache,
    `streams` files at once (one reader thread each), `total` bytes in all (`plain_read`)."""
    paths = [directory / f"seqread-{i}.bin" for i in range(streams)]
    block = os.urandom(chunk)
    for path in paths:
        with open(path, "wb") as f:
            for _ in range(total // chunk // streams):
                f.write(block)
    rate = plain_read([str(p) for p in paths], streams, chunk)
    for path in paths:
        path.unlink()
    return rate


def plain_read(paths: list[str], streams: int = READERS, chunk: int = 4 << 20) -> float:
    """Bytes/s of a plain sequential read of `paths` (each whole, `streams` files at once,
    `chunk` bytes per read) after writing them back and dropping them from the page cache:
    the disk's rate for the very files the disk tier just read, moments later."""
    from concurrent.futures import ThreadPoolExecutor

    for path in paths:
        drop_page_cache(path)

    def read(path: str) -> int:
        buf, n = bytearray(chunk), 0
        with open(path, "rb", buffering=0) as f:
            while got := f.readinto(buf):
                n += got
        return n

    t0 = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        total = sum(pool.map(read, paths))
    return total / (time.perf_counter() - t0)


def paged_in() -> int:
    """Bytes this machine has read from block devices so far (/proc/vmstat pgpgin, in KiB)."""
    with open("/proc/vmstat") as f:
        for line in f:
            if line.startswith("pgpgin "):
                return int(line.split()[1]) * 1024
    return 0


def _rate(before: dict, after: dict, nbytes: str, seconds: str) -> float:
    """Bytes/s of a worker's loads between two counter snapshots (0 if it loaded nothing)."""
    dt = after.get(seconds, 0) - before.get(seconds, 0)
    return (after.get(nbytes, 0) - before.get(nbytes, 0)) / dt if dt > 0 else 0.0


async def _measure(rig: KVRig, lengths: list[int], reps: int) -> dict:
    client = rig.store_client()
    names = ("recompute", "memory", "disk", "cached", "pool_Bps", "disk_tier_Bps", "device_share", "shm_share",
             "plain_Bps")
    rows: dict[int, dict[str, list]] = {n: {k: [] for k in names} for n in lengths}
    from tqdm import tqdm

    bar = tqdm(total=len(lengths) * reps, desc="bench kv", unit="prefix", file=sys.stderr)
    seed = 0
    await rig.decode([5] * 64, max_tokens=1)  # warm both paths once
    for rep in range(reps):
        for n in lengths:
            seed += 1
            rnd = random.Random(seed)
            fresh = [rnd.randrange(2, 1000) for _ in range(n)]
            await rig.reset_local_caches()
            rows[n]["recompute"].append((await rig.decode(fresh, max_tokens=1)).ttft_s)

            seed += 1
            rnd = random.Random(seed)
            prompt = [rnd.randrange(2, 1000) for _ in range(n)]
            before = set(rig.spill_files())
            await rig.prefill(prompt)
            await rig.wait_spilled()
            files = {p: k for p, k in rig.spill_files().items() if p not in before}
            await rig.reset_local_caches()
            s0 = await rig.spill_stats("decode")
            mem = await rig.decode(prompt, max_tokens=1)
            s1 = await rig.spill_stats("decode")
            rows[n]["memory"].append(mem.ttft_s)
            rows[n]["cached"].append(mem.cached_tokens)
            rows[n]["pool_Bps"].append(_rate(s0, s1, "pool_load_bytes", "pool_load_s"))
            pooled = s1.get("pool_load_bytes", 0) - s0.get("pool_load_bytes", 0)
            shm = s1.get("shm_loaded_bytes", 0) - s0.get("shm_loaded_bytes", 0)
            rows[n]["shm_share"].append(shm / pooled if pooled else 0.0)

            for k in files.values():
                client.remove(k, True)
            for p in files:
                drop_page_cache(p)
            await rig.reset_local_caches()
            s0, dev0 = await rig.spill_stats("decode"), paged_in()
            rows[n]["disk"].append((await rig.decode(prompt, max_tokens=1)).ttft_s)
            s1, dev1 = await rig.spill_stats("decode"), paged_in()
            rows[n]["disk_tier_Bps"].append(_rate(s0, s1, "loaded_from_disk_bytes", "disk_load_s"))
            loaded = s1.get("loaded_from_disk_bytes", 0) - s0.get("loaded_from_disk_bytes", 0)
            rows[n]["device_share"].append((dev1 - dev0) / loaded if loaded else 0.0)
            rows[n]["plain_Bps"].append(plain_read(list(files)))
            bar.update(1)
    bar.close()
    return rows


async def _traffic(rig: KVRig) -> dict:
    """Store traffic over the run per byte of KV the pool accepted (saved): the puts
    themselves, plus what was read back from the pool to spill it or promoted into it."""
    p, d = await rig.spill_stats("prefill"), await rig.spill_stats("decode")
    saved = p.get("saved_bytes", 0) or 1
    moved = {name: p.get(name, 0) + d.get(name, 0)
             for name in ("pool_reread_bytes", "pool_promote_bytes", "tier_put_bytes")}
    return {"saved_MiB": round(saved / 2**20, 1),
            "store_bytes_per_saved_byte": round((saved + moved["pool_reread_bytes"]
                                                 + moved["pool_promote_bytes"]) / saved, 3),
            "disk_bytes_written_per_saved_byte": round(moved["tier_put_bytes"] / saved, 3),
            **{k: round(v / 2**20, 1) for k, v in moved.items()}}


def _summary(rows: dict, kv_bytes_per_token: int) -> list[dict]:
    out = []
    for n, r in rows.items():
        med = {k: statistics.median(v) for k, v in r.items()}
        out.append({
            "prefix_tokens": n, "cached_tokens": int(med["cached"]),
            "kv_mib": round(med["cached"] * kv_bytes_per_token / 2**20, 2),
            "ttft_recompute_ms": round(med["recompute"] * 1e3, 1),
            "ttft_memory_ms": round(med["memory"] * 1e3, 1),
            "ttft_disk_ms": round(med["disk"] * 1e3, 1),
            "memory_vs_recompute": round(med["memory"] / med["recompute"], 3),
            "disk_vs_recompute": round(med["disk"] / med["recompute"], 3),
            "pool_read_MBps": round(med["pool_Bps"] / 1e6),
            "pool_bytes_via_shm": round(med["shm_share"], 2),
            "disk_tier_read_MBps": round(med["disk_tier_Bps"] / 1e6),
            # what the block devices delivered while the disk tier loaded, per byte loaded
            # (about 1: the bytes came from the disk, not the page cache)
            "device_read_per_loaded_byte": round(med["device_share"], 2),
            # the same files read plainly right after, and the tier's rate against it (paired per rep)
            "plain_read_MBps": round(med["plain_Bps"] / 1e6),
            "disk_tier_vs_plain_read": round(statistics.median(
                t / b for t, b in zip(r["disk_tier_Bps"], r["plain_Bps"]) if b), 3),
        })
    return out


def _plot(summary: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [s["prefix_tokens"] for s in summary]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("ttft_recompute_ms", "recompute"), ("ttft_memory_ms", "memory tier"),
                       ("ttft_disk_ms", "disk tier")):
        ax.plot(x, [s[key] for s in summary], marker="o", label=label)
    ax.set_xlabel("prefix length (tokens)")
    ax.set_ylabel("decode TTFT, median (ms)")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baton bench kv", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "bench", "kv"], default="kv",
                        help="tiny: the default 2-layer model; bench: an 8-layer, 1024-wide Llama; "
                             "kv: 16 layers, 8 KV heads of 128 (128 KiB of KV per token)")
    parser.add_argument("--lengths", default="1024,1536,1984", help="prefix lengths in tokens")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--pool", default="4GB", help="Mooncake memory pool")
    parser.add_argument("--plot", type=Path, default=None, help="PNG path (default: in the workdir)")
    parser.add_argument("--no-shm", action="store_true",
                        help="mooncake.shm_reads off: pool loads over the transfer engine's TCP (the peer)")
    args = parser.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    from cluster.default_model import tiny_model

    model = MODELS / {"tiny": "tiny-llama", "bench": "bench-llama", "kv": "kv-llama"}[args.model]
    print(f"model {model} ...", file=sys.stderr, flush=True)
    tiny_model.generate(model, size=args.model)
    workdir = bench_workdir("bench-kv")
    cfg = rig_config(workdir, kv_cache_gb=1, model=model, global_segment_size=args.pool,
                     spill_cap="64GB", spill_min_free="2GB", shm_reads=not args.no_shm)
    print("raw bandwidths ...", file=sys.stderr, flush=True)
    tcp = loopback_tcp_bandwidth()
    seq = disk_sequential_read(cfg.spill_path().parent)
    seq_par = disk_sequential_read(cfg.spill_path().parent, streams=READERS)
    rig = KVRig(cfg, workdir)
    try:
        rows, traffic = asyncio.run(_run(rig, lengths, args.reps))
    finally:
        rig.close()
    from deployments.front.metrics import kv_bytes_per_token

    summary = _summary(rows, kv_bytes_per_token(model, cfg.model.dtype))
    result = {"model": args.model, "reps": args.reps, "shm_reads": not args.no_shm,
              "loopback_tcp_MBps": round(tcp / 1e6),
              "disk_seq_read_MBps": round(seq / 1e6), f"disk_seq_read_{READERS}_streams_MBps": round(seq_par / 1e6),
              "traffic": traffic, "by_length": summary}
    print(f"{'tokens':>7} {'KV MiB':>7} {'recompute':>10} {'memory':>8} {'disk':>8} "
          f"{'mem/re':>7} {'disk/re':>8} {'pool MB/s':>10} {'via shm':>8} {'disk MB/s':>10} {'from dev':>9}")
    for s in summary:
        print(f"{s['prefix_tokens']:>7} {s['kv_mib']:>7} {s['ttft_recompute_ms']:>9}ms "
              f"{s['ttft_memory_ms']:>6}ms {s['ttft_disk_ms']:>6}ms {s['memory_vs_recompute']:>7} "
              f"{s['disk_vs_recompute']:>8} {s['pool_read_MBps']:>10} {s['pool_bytes_via_shm']:>8} "
              f"{s['disk_tier_read_MBps']:>10} "
              f"{s['device_read_per_loaded_byte']:>9} {s['plain_read_MBps']:>11} "
              f"{s['disk_tier_vs_plain_read']:>11}")
    print(f"raw loopback TCP {result['loopback_tcp_MBps']} MB/s, disk sequential read "
          f"{result['disk_seq_read_MBps']} MB/s (one stream), {round(seq_par / 1e6)} MB/s ({READERS} streams)")
    print(f"store traffic {traffic['store_bytes_per_saved_byte']} B per B of KV saved "
          f"({traffic['saved_MiB']} MiB saved), disk writes {traffic['disk_bytes_written_per_saved_byte']} B/B")
    (workdir / "bench_kv.json").write_text(json.dumps(result, indent=2))
    plot = args.plot or workdir / "bench_kv.png"
    _plot(summary, plot, f"KV tiers vs recompute ({args.model} model)")
    print(f"plot: {plot}", file=sys.stderr)
    print("BENCH_KV_JSON " + json.dumps(result))
    return 0


async def _run(rig: KVRig, lengths: list[int], reps: int) -> tuple[dict, dict]:
    await rig.start(progress=lambda m: print(m, file=sys.stderr, flush=True))
    rows = await _measure(rig, lengths, reps)
    return rows, await _traffic(rig)


if __name__ == "__main__":
    sys.exit(main())
