"""The KV indexer fills gaps in an engine's event stream from the engine's replay buffer.

Real components: vLLM's ZmqEventPublisher (its replay socket and buffer),
a real Redis, and the indexer's EventLoop; no engine. Batches are handed to
the loop in the order a lossy stream would deliver them.
"""

from __future__ import annotations

import contextlib
import signal
import time

import msgspec
import pytest
import redis

from common.config import BatonConfig
from common.processes import free_ports
from deployments.kv_index.kv_indexer import EventLoop
from routing.prefix.redis_state import Registry, registry_key
from tests.unit.conftest import restart_redis, start_redis

BLOCK = 2


@contextlib.contextmanager
def _rig(redis_url: str, buffer_steps: int = 10_000):
    """(indexer loop with its thread stopped, vLLM publisher of replica r1, Redis client)."""
    from vllm.distributed.kv_events import ZmqEventPublisher

    sink, events, replay_port = free_ports(3)
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    cfg = BatonConfig.model_validate({"redis": {"url": redis_url}, "model": {"block_size": BLOCK},
                                      "routing": {"events_port": events, "replica_timeout_s": 60}})
    loop = EventLoop(cfg)
    loop.stop()  # the test hands batches over and runs the checks itself
    loop.thread.join(5)
    endpoint = f"tcp://127.0.0.1:{replay_port}"
    # The live stream goes to a socket nobody reads: every batch reaches the
    # loop only as the test hands it over, or through the replay socket.
    pub = ZmqEventPublisher(0, endpoint=f"tcp://127.0.0.1:{sink}", replay_endpoint=endpoint,
                            buffer_steps=buffer_steps, topic="r1")
    Registry.beat(client, "decode", "r1", {"events_replay": endpoint})
    try:
        yield loop, pub, client
    finally:
        pub.shutdown()
        client.close()


@pytest.fixture
def rig(redis_url):
    with _rig(redis_url) as r:
        yield r


def _batch(i: int):
    """Batch `i` of a chain: block 1000 + i stored, its parent the block of batch i - 1."""
    from vllm.distributed.kv_events import BlockStored, KVEventBatch

    return KVEventBatch(ts=time.time(), events=[BlockStored(
        block_hashes=[1000 + i], parent_block_hash=(1000 + i - 1) if i else None,
        token_ids=[i, i], block_size=BLOCK, lora_id=None, medium="GPU", lora_name=None)])


def _batches(pub, n: int) -> list[bytes]:
    """Publishes n batches of one stored block each (chained), returns their payloads."""
    enc, out = msgspec.msgpack.Encoder(), []
    for i in range(n):
        batch = _batch(i)
        pub.publish(batch)
        out.append(enc.encode(batch))
    # until the last is in the replay buffer: its length alone never reaches n when it keeps fewer
    # (a 1- or 3-batch buffer waited out the whole deadline, 10 s a test)
    deadline = time.monotonic() + 10
    while not (pub._buffer and pub._buffer[-1][0] >= n - 1) and time.monotonic() < deadline:
        time.sleep(0.01)
    return out


def test_a_gap_is_filled_from_the_replay_buffer(rig):
    loop, pub, _ = rig
    payloads = _batches(pub, 5)
    loop._receive("r1", 0, payloads[0])
    loop._receive("r1", 4, payloads[4])  # 1..3 lost on the way
    assert loop.gaps["r1"] == 1 and loop.replayed["r1"] == 3 and loop.resyncs["r1"] == 0
    assert len(loop.translator.known("r1", [1000 + i for i in range(5)])) == 5
    loop._receive("r1", 2, payloads[2])  # a late duplicate changes nothing
    assert loop.seqs.expected["r1"] == 5 and loop.applied["r1"] == 5


def test_an_indexer_that_starts_late_replays_from_zero(rig):
    loop, pub, _ = rig
    payloads = _batches(pub, 3)
    loop._receive("r1", 2, payloads[2])
    assert loop.replayed["r1"] == 2
    assert len(loop.translator.known("r1", [1000, 1001, 1002])) == 3


def test_an_unrecoverable_gap_or_a_restart_forgets_the_holdings(rig):
    loop, pub, client = rig
    payloads = _batches(pub, 4)
    loop._receive("r1", 0, payloads[0])
    client.delete(registry_key("decode"))  # no replay endpoint known any more
    loop._receive("r1", 3, payloads[3])
    assert loop.resyncs["r1"] == 1 and loop.translator.known("r1", [1000]) == []
    loop._receive("r1", 0, payloads[0])  # numbers back to 0: a new engine process
    assert loop.resyncs["r1"] == 2 and loop.translator.known("r1", [1000]) != []


def test_a_redis_that_lost_its_data_gets_the_index_back(rig):
    loop, pub, client = rig
    payloads = _batches(pub, 3)
    loop._check_redis()  # first start: the epoch is set, nothing to rebuild
    for seq, payload in enumerate(payloads):
        loop._receive("r1", seq, payload)
    stored = {k for k in client.keys("baton:idx:*")}
    assert stored
    loop._sweep()  # as every second: notes the replay socket of each registered engine
    client.flushdb()  # a Redis restart without persistence: index, registry and all
    loop._check_redis()  # rewritten from the indexer's maps, links too: no replay needed
    assert loop.redis_losses == 1 and loop.rewrites["r1"] == 1 and loop.resyncs["r1"] == 0
    assert {k for k in client.keys("baton:idx:*")} == stored
    loop._check_redis()  # the epoch is back: nothing more to do
    assert loop.redis_losses == 1


def _successor(loop: EventLoop) -> EventLoop:
    """A new indexer in place of `loop` (whose socket it takes), its thread stopped like the rig's."""
    import zmq

    loop.sock.close(0)
    deadline = time.monotonic() + 10
    while True:  # a closed socket's port is let go by ZMQ's I/O thread, a moment later
        try:
            new = EventLoop(loop.cfg)
            break
        except zmq.ZMQError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    new.stop()
    new.thread.join(5)
    return new


def _removal(pub, engine_hash: int) -> bytes:
    """Publishes one batch removing `engine_hash`; returns its payload."""
    from vllm.distributed.kv_events import BlockRemoved, KVEventBatch

    batch = KVEventBatch(ts=time.time(), events=[BlockRemoved(block_hashes=[engine_hash], medium="GPU")])
    pub.publish(batch)
    return msgspec.msgpack.Encoder().encode(batch)


def test_a_replacement_indexer_resumes_from_the_saved_state(redis_url):
    """The engine's buffer no longer reaches back to batch 0 (it keeps 3): a new indexer resumes at
    the batch after the old one's last and replays only the two published while none ran. Blocks the
    old indexer announced are removed by their engine hashes through the restored map."""
    with _rig(redis_url, buffer_steps=3) as (loop, pub, client):
        payloads = _batches(pub, 5)
        loop._check_redis()
        loop._sweep()  # notes r1's replay socket, saved with its position
        for seq in range(3):
            loop._receive("r1", seq, payloads[seq])
        # (batches 3 and 4 are published while no indexer runs)
        new = _successor(loop)
        assert new.resumed["r1"] == 1 and new.seqs.expected["r1"] == 3
        removal = _removal(pub, 1000)
        new._receive("r1", 5, removal)
        assert new.replayed["r1"] == 2 and new.resyncs["r1"] == 0
        first, *rest = loop.translator.known("r1", [1000, 1001, 1002])
        held = {int(h) for h in client.smembers("baton:idx:r:r1")}
        assert set(rest) <= held and first not in held and len(held) == 4, held
        # Without the saved state, the same takeover forgets r1: the buffer starts at batch 3.
        for key in client.keys("baton:idx:tr*") + client.keys("baton:idx:seq"):
            client.delete(key)
        blind = _successor(new)
        blind._receive("r1", 6, _removal(pub, 1001))
        assert blind.resumed["r1"] == 0 and blind.resyncs["r1"] == 1
        assert not client.exists("baton:idx:r:r1")


def test_a_replacement_forgets_an_engine_that_restarted_meanwhile(rig):
    """The saved replay socket is not the registered one any more: a new engine process, whose
    numbering restarted, sits behind the replica id. Its old holdings are forgotten, not resumed."""
    loop, pub, client = rig
    payloads = _batches(pub, 2)
    loop._check_redis()
    loop._sweep()
    for seq in range(2):
        loop._receive("r1", seq, payloads[seq])
    Registry.beat(client, "decode", "r1", {"events_replay": "tcp://127.0.0.1:1"})
    new = _successor(loop)
    assert new.resumed["r1"] == 0 and "r1" not in new.seqs.expected
    assert not client.exists("baton:idx:r:r1") and not client.hexists("baton:idx:seq", "r1")


def _until_answered(call, timeout_s: float = 10.0):
    """`call()`, again while it meets the connection a restart closed (the loop's own retry is its
    sweep, every second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _aof_written(client, timeout_s: float = 10) -> None:
    """Until Redis has written its append-only buffer to the file (with everysec it may hold the
    write back for up to 2 s while a slow background fsync runs, as on a loaded machine)."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = client.info("persistence")
        if info.get("aof_buffer_length", 0) == 0 and info.get("aof_pending_bio_fsync", 0) == 0:
            return
        assert time.monotonic() < deadline, info
        time.sleep(0.05)


def _aof_bytes(directory) -> int:
    return sum(f.stat().st_size for f in (directory / "appendonlydir").iterdir())


def test_the_index_stays_out_of_the_append_only_file(tmp_path):
    """Blocks stored and removed, the indexer's journal, positions and epoch reach Redis's memory
    but not its file (with `always`, every logged write waited for an fsync: the indexer's lag p99
    was 150 ms at 32 engines); other writes are logged as before."""
    server, url = start_redis(tmp_path, "always")
    try:
        with _rig(url) as (loop, pub, client):
            payloads = _batches(pub, 40)
            before = _aof_bytes(tmp_path)
            loop._check_redis()
            for seq, payload in enumerate(payloads):
                loop._receive("r1", seq, payload)
            loop._receive("r1", 40, _removal(pub, 1039))
            with loop._batch():
                loop._forget("r1")
                loop._receive("r1", 41, _removal(pub, 1038))  # r1 again, after the clear
            assert client.hexists("baton:idx:seq", "r1") and client.exists("baton:indexer:epoch")
            assert _aof_bytes(tmp_path) == before, client.info("persistence")
            client.set("baton:other", "1")
            assert _aof_bytes(tmp_path) > before
    finally:
        server.stop()


def _kill_and_miss_a_batch(loop, server, payload) -> None:
    """SIGKILLs Redis, then hands `loop` batch 2 of r1 on its live socket: the drain fails."""
    import zmq

    feed = loop.ctx.socket(zmq.PUB)  # the live stream, as an engine sends it
    feed.connect(f"tcp://127.0.0.1:{loop.sock.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(':', 1)[1]}")
    try:
        _kill(server)
        for _ in range(50):  # sent until the subscription has reached the publisher (repeats are stale)
            feed.send_multipart([b"r1", (2).to_bytes(8, "big"), payload])
            if loop.sock.poll(100):
                break
        with pytest.raises(redis.RedisError):
            loop._drain()
    finally:
        feed.close(0)


@pytest.mark.parametrize("buffer_steps", [10_000, 1])
def test_a_killed_redis_gets_the_index_back(tmp_path, buffer_steps):
    """Redis keeps its data through a kill (redis.appendfsync), but not the index, which stays out
    of its file, and it missed the batch applied while it was down. Once it answers, r1 is rewritten
    from the indexer's own maps, parent links included, however far the engine's buffer reaches
    back: the index holds what one that never saw the outage holds (with a one-batch buffer the
    replica used to be forgotten, and later rewritten without its links)."""
    from deployments.kv_index import indexer_state

    server, url = start_redis(tmp_path, "always")
    with _rig(url, buffer_steps) as (loop, pub, client):
        payloads = _batches(pub, 3)
        loop._check_redis()  # first start: the epoch is set, Redis's run id noted
        for seq in (0, 1):
            loop._receive("r1", seq, payloads[seq])
        loop._sweep()  # notes r1's replay socket
        _kill_and_miss_a_batch(loop, server, payloads[2])
        assert loop.unwritten == {"r1"} and loop.seqs.expected["r1"] == 3
        restart_redis(server)  # its file is loaded
        try:
            assert not client.exists("baton:idx:r:r1")  # not in the file
            _until_answered(loop._check_redis)
            assert loop.redis_losses == 1 and loop.rewrites["r1"] == 1 and not loop.unwritten
            assert loop.replayed["r1"] == 0
            hashes = loop.translator.known("r1", [1000, 1001, 1002])
            assert len(hashes) == 3 and loop.resyncs["r1"] == 0
            assert {int(h) for h in client.smembers("baton:idx:r:r1")} == set(hashes)
            for parent, child in zip(hashes, hashes[1:]):
                assert {int(h) for h in client.smembers(f"baton:idx:c:{parent}")} == {child}
            saved = indexer_state.load(client)  # the journal, written again
            assert {baton for baton, *_ in saved.maps["r1"].values()} == set(hashes)
        finally:
            server.stop()


def _rewritten_file(client, timeout_s: float = 20) -> None:
    """Until a BGREWRITEAOF has copied Redis's memory, the index included, into its file."""
    client.bgrewriteaof()
    deadline = time.monotonic() + timeout_s
    while True:
        info = client.info("persistence")
        if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
            assert info["aof_last_bgrewrite_status"] == "ok", info
            return
        assert time.monotonic() < deadline, info
        time.sleep(0.05)


def test_a_redis_restarted_with_a_stale_copy_of_the_index_is_rewritten(tmp_path):
    """Redis's file rewrite copies its memory, the index and the indexer's state included: a
    restart loads that copy, stale by then, epoch and all. The new run id tells the indexer, which
    rewrites r1 from its maps (the block removed since goes again, the links stay) and forgets r2,
    which it had forgotten since the copy."""
    server, url = start_redis(tmp_path, "always")
    with _rig(url) as (loop, pub, client):
        payloads = _batches(pub, 3)
        loop._check_redis()
        for seq, payload in enumerate(payloads):
            loop._receive("r1", seq, payload)
        with loop._batch():  # a second replica, known then
            loop.seqs.applied("r2", 0)
            loop.writer.apply_stored("r2", [77, 78])
            loop.moved.add("r2")
        _rewritten_file(client)
        loop._receive("r1", 3, _removal(pub, 1002))
        with loop._batch():  # r2 forgotten, as a stale heartbeat does (`_sweep`)
            loop._forget("r2")
            loop.seqs.forget("r2")
            loop.moved.add("r2")
        _kill(server)
        restart_redis(server)
        try:
            assert client.scard("baton:idx:r:r1") == 3 and client.exists("baton:idx:r:r2")  # the stale copy
            _until_answered(loop._check_redis)
            assert loop.redis_losses == 1 and loop.rewrites["r1"] == 1
            hashes = loop.translator.known("r1", [1000, 1001])
            assert {int(h) for h in client.smembers("baton:idx:r:r1")} == set(hashes)
            assert {int(h) for h in client.smembers(f"baton:idx:c:{hashes[0]}")} == {hashes[1]}
            assert not client.exists("baton:idx:r:r2") and not client.exists("baton:idx:h:77")
            assert not client.hexists("baton:idx:seq", "r2") and not client.exists("baton:idx:tr:r2")
            loop._check_redis()  # the same Redis: nothing more to do
            assert loop.redis_losses == 1 and loop.rewrites["r1"] == 1
        finally:
            server.stop()


def _kill(server) -> None:
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(10)


def test_a_whole_map_is_journalled_in_chunks(rig):
    """A rewrite journals a replica's whole map again; an H100's cache holds tens of thousands of
    blocks, more arguments than one unlogged script call takes (Lua's stack)."""
    from deployments.kv_index import indexer_state

    loop, _, client = rig
    entries = {i: (10**6 + i, "t", None) for i in range(20_000)}
    loop.translator.restore("r9", entries)
    with loop._batch():
        loop.translator.rejournal("r9")
        loop.seqs.applied("r9", 0)
        loop.moved.add("r9")
    assert indexer_state.load(client).maps["r9"] == entries
