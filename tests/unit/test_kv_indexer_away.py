"""The KV indexer's own thread when Redis stops answering: it checks Redis every AWAY_S until it
answers, and rebuilds there what Redis lost, without waiting for its next sweep."""

from __future__ import annotations

import time

import msgspec
import redis

from common.config import BatonConfig
from common.processes import free_ports
from deployments.kv_index.kv_indexer import EventLoop
from routing.prefix.redis_state import Registry
from tests.unit.conftest import restart_redis, start_redis
from tests.unit.test_kv_indexer_replay import BLOCK, _batch, _kill, _until_answered


def test_a_running_indexer_rebuilds_a_restarted_redis_before_its_next_sweep(tmp_path, monkeypatch):
    """The indexer's own thread, not the test, drives the loop. A write that fails makes it check
    Redis every AWAY_S until it answers, and rebuild there what Redis lost: here no sweep falls
    due for 30 s, and the index is back within seconds of the restart (it waited for the sweep
    before, and routing under-predicted meanwhile)."""
    import zmq
    from deployments.kv_index import kv_indexer

    monkeypatch.setattr(kv_indexer, "SWEEP_S", 30.0)
    server, url = start_redis(tmp_path, "always")
    events = free_ports(1)[0]
    client = redis.Redis.from_url(url)
    Registry.beat(client, "decode", "r1", {})
    cfg = BatonConfig.model_validate({"redis": {"url": url}, "model": {"block_size": BLOCK},
                                      "routing": {"events_port": events, "replica_timeout_s": 60}})
    loop = EventLoop(cfg)
    feed = loop.ctx.socket(zmq.PUB)
    feed.connect(f"tcp://127.0.0.1:{events}")
    enc = msgspec.msgpack.Encoder()

    def send(seq: int) -> None:
        feed.send_multipart([b"r1", seq.to_bytes(8, "big"), enc.encode(_batch(seq))])

    def indexed() -> int:
        return client.scard("baton:idx:r:r1")

    def until(what, timeout_s: float = 10.0, resend: int | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        while not _until_answered(what):
            assert time.monotonic() < deadline
            if resend is not None:  # until the subscription reached the publisher (repeats are stale)
                send(resend)
            time.sleep(0.05)

    try:
        until(lambda: indexed() == 1, resend=0)
        send(1)
        until(lambda: indexed() == 2)
        _kill(server)
        send(2)  # applied to the loop's maps; its write fails
        until(lambda: loop.unwritten == {"r1"})
        restart_redis(server)  # the registry comes back from its file, the index does not
        until(lambda: indexed() == 3)
        assert loop.redis_losses == 1 and loop.rewrites["r1"] == 1
        assert {int(h) for h in client.smembers("baton:idx:r:r1")} == set(
            loop.translator.known("r1", [1000, 1001, 1002]))
    finally:
        feed.close(0)
        loop.stop()
        client.close()
        server.stop()
