"""Pool reads through shared memory (kvstore/shm_pool.py) against real master and store processes."""

from __future__ import annotations

import numpy as np
import pytest

from cluster import loopback
from common.config import MooncakeConfig
from common.processes import free_ports
from kvstore import mooncake
from kvstore.shm_pool import ShmPoolReader, attach

OBJ, SLICES = 1 << 20, 4  # objects of 4 slices of 256 KiB, as a KV block is one slice per layer and K/V


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    from mooncake.store import MooncakeDistributedStore

    p = free_ports(5)
    cfg = MooncakeConfig(master_port=p[0], metadata_port=p[1], master_metrics_port=p[2], store_port=p[3],
                         store_http_port=p[4], global_segment_size="256MB")
    log_dir = tmp_path_factory.mktemp("mooncake")
    procs = [mooncake.master_process(cfg, log_dir), mooncake.store_process(cfg, log_dir)]
    for proc in procs:
        proc.env.update(loopback.env())  # wildcard binds on loopback
    try:
        for proc in procs:
            proc.start()
            proc.wait_ready(30)
        client = MooncakeDistributedStore()  # a worker's own handle: the transfer engine over TCP
        assert client.setup("127.0.0.1", mooncake.metadata_url(cfg), 0, 64 << 20, "tcp", "",
                            f"127.0.0.1:{cfg.master_port}") == 0
        yield cfg, client
        client.close()
    finally:
        for proc in reversed(procs):
            proc.stop()


def _buffers(client, n: int):
    """n objects' worth of registered KV-like buffers: one array, each object's slices spread apart."""
    buf = np.zeros(n * OBJ * 2, dtype=np.uint8)  # gaps between slices, as between a layer's blocks
    assert client.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    step = OBJ * 2 // SLICES
    addrs = [[buf.ctypes.data + i * OBJ * 2 + s * step for s in range(SLICES)] for i in range(n)]
    return buf, addrs, [[OBJ // SLICES] * SLICES for _ in range(n)]


def _slices(buf: np.ndarray, addrs: list[int]) -> bytes:
    base = buf.ctypes.data
    return b"".join(buf[a - base:a - base + OBJ // SLICES].tobytes() for a in addrs)


def test_reads_through_shared_memory_match_the_transfer_engine(pool):
    cfg, client = pool
    rng = np.random.default_rng(0)
    n = 12
    src, src_addrs, sizes = _buffers(client, n)
    src[:] = rng.integers(0, 256, src.size, dtype=np.uint8)
    keys = [f"shm-test-{i}" for i in range(n)]
    assert all(r == 0 for r in client.batch_put_from_multi_buffers(keys, src_addrs, sizes))

    # A staging area of 5 objects: the 12 keys take three shared reads.
    reader = attach(client, f"127.0.0.1:{cfg.store_port}", 5 * OBJ)
    assert isinstance(reader, ShmPoolReader)
    dst, dst_addrs, _ = _buffers(client, n + 1)
    got = reader.batch_get_into_multi_buffers(keys + ["shm-test-missing"], dst_addrs, sizes + [sizes[0]])
    assert got[:n] == [OBJ] * n and got[n] < 0  # a missing key is a miss, as over TCP
    for i in range(n):
        assert _slices(dst, dst_addrs[i]) == _slices(src, src_addrs[i]), i
    assert reader.stats["shm_loaded"] == n and reader.stats["shm_loaded_bytes"] == n * OBJ
    assert reader.stats["fallback_keys"] == 1  # only the missing key went to the transfer engine
    assert reader.batch_is_exist(keys[:2]) == client.batch_is_exist(keys[:2])  # everything else passes through


def test_no_store_on_this_address_keeps_the_transfer_engine(pool):
    _, client = pool
    assert attach(client, f"127.0.0.1:{free_ports(1)[0]}", OBJ) is None
