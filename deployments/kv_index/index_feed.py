"""The KV index streamed to every front, so a routing decision reads no index from Redis.

The KV indexer writes each drain of engine events to Redis (routing/prefix/redis_index.py
`RedisIndex`) and, in the same round trip, publishes the same updates on a Redis
channel (`FeedWriter`). Each front keeps the index in its own memory
(`LocalIndex`): it subscribes first, then loads the index Redis holds, then
applies every update published since it subscribed, in order. Set operations
make that replay safe: a block's state is decided by the last update that
touched it, whatever the loaded copy already had. Every message carries the
indexer's epoch and a sequence number; a gap, a new epoch (the indexer
restarted) or a lost connection makes the front load the index again, and
until it has, its decisions read the index slice from Redis as before.

At 64 engines a decision that reads 300 blocks' holders from Redis costs about
8 ms and 600 commands (`baton bench scale --part control`); from memory it is
a walk over the same blocks. The price is the index's memory in each front.
"""

from __future__ import annotations

import asyncio
import os

import msgspec

from routing.prefix.prefix_index import PrefixIndex
from routing.prefix.redis_index import RedisIndex
from routing.prefix.redis_state import P

CHANNEL = f"{P}idx:feed"
_decode = msgspec.msgpack.Decoder()


class FeedWriter:
    """The indexer's writer: RedisIndex's updates, also published on CHANNEL after each flush (or
    at once outside a batch). Same interface as RedisIndex's updates and batches."""

    def __init__(self, writer: RedisIndex, then=None):
        self.writer = writer
        self.then = then  # queues the indexer's own state after each flush's updates (RedisIndex.flush)
        self.epoch = os.urandom(6).hex()
        self.seq = 0
        self.ops: list = []
        self._batched = False

    def begin(self) -> None:
        self.writer.begin()
        self._batched = True

    def flush(self) -> None:
        """Sends the batch's updates to Redis and publishes them in the same pipeline."""
        self._batched = False
        self.writer.flush(publish=self._message(), then=self.then)

    @property
    def batched(self) -> bool:
        """Whether updates are being queued for a `flush`."""
        return self._batched

    def _message(self) -> tuple[str, bytes] | None:
        if not self.ops:
            return None
        ops, self.ops = self.ops, []
        self.seq += 1
        return CHANNEL, msgspec.msgpack.encode([self.epoch, self.seq, ops])

    def _done(self) -> None:
        if not self._batched and (msg := self._message()):
            self.writer.r.publish(*msg)

    def apply_stored(self, replica: str, block_hashes, parent: int | None = None) -> None:
        hashes = list(block_hashes)
        self.writer.apply_stored(replica, hashes, parent)
        self.ops.append(["s", replica, parent, hashes])
        self._done()

    def apply_removed(self, replica: str, block_hashes) -> None:
        hashes = list(block_hashes)
        self.writer.apply_removed(replica, hashes)
        if hashes:
            self.ops.append(["r", replica, hashes])
        self._done()

    def apply_cleared(self, replica: str) -> None:
        self.writer.apply_cleared(replica)
        self.ops.append(["c", replica])
        self._done()

    def remove_replica(self, replica: str) -> None:
        self.apply_cleared(replica)


def apply(index: PrefixIndex, ops: list) -> None:
    """Applies one feed message's updates to `index`, in order."""
    for op in ops:
        if op[0] == "s":
            index.apply_stored(op[1], op[3], op[2])
        elif op[0] == "r":
            index.apply_removed(op[1], op[2])
        else:
            index.apply_cleared(op[1])


async def load(redis, index: PrefixIndex, batch: int = 500) -> None:
    """Fills `index` with what Redis holds: every replica's blocks and every block's children."""
    def held(replica: str, blocks: list[int]) -> None:
        for h in blocks:  # one at a time: a list would be taken for a chain, each block its predecessor's child
            index.apply_stored(replica, [h])

    for pattern, fill in ((f"{P}idx:r:*", held),
                          (f"{P}idx:c:*", lambda key, members: index.restore_children(int(key), members))):
        prefix = len(pattern) - 1
        async for keys in scan(redis, pattern, batch):
            pipe = redis.pipeline(transaction=False)
            for k in keys:
                pipe.smembers(k)
            for k, members in zip(keys, await pipe.execute()):
                name = (k.decode() if isinstance(k, bytes) else k)[prefix:]
                fill(name, [int(m) for m in members])


async def scan(redis, pattern: str, batch: int):
    """The keys matching `pattern`, in batches of about `batch`."""
    cursor = 0
    while True:
        cursor, keys = await redis.scan(cursor, match=pattern, count=batch)
        if keys:
            yield keys
        if not cursor:
            return


class FeedFollower:
    """Follows a Redis feed in a task of its own: `_follow()` (a subclass's) subscribes, loads and
    applies messages until the connection fails; then `_lost()` runs and, half a second later, the
    next `_follow()` loads again. `resyncs` counts the losses."""

    def __init__(self):
        self.resyncs = 0
        self._task: asyncio.Future | None = None
        self._stopping = False

    def start(self) -> None:
        """Starts following the feed on the running event loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        """Stops following the feed; call it before the Redis client closes (a subscription whose
        client closed first can keep the task from ending)."""
        self._stopping = True  # redis-py's read timeout can swallow a cancellation: the loops check this too
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=5)

    async def _follow(self) -> None:
        raise NotImplementedError

    def _lost(self) -> None:
        """What a lost feed changes, before the next load."""

    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a gap, a restart or Redis away: load again
                if asyncio.current_task().cancelling():  # stopping: an error on the way out ends it too
                    raise asyncio.CancelledError from None
                self.resyncs += 1
                self._lost()
                await asyncio.sleep(0.5)


class LocalIndex(FeedFollower):
    """This front's copy of the KV index, kept by the feed (module docstring). `index` is a
    PrefixIndex while in step with the indexer, None while (re)loading."""

    def __init__(self, redis, on_resync=None):
        super().__init__()
        self.redis = redis
        self.index: PrefixIndex | None = None
        self._on_resync = on_resync

    def _lost(self) -> None:
        self.index = None
        if self._on_resync:
            self._on_resync()

    async def _follow(self) -> None:
        pubsub = self.redis.pubsub()
        try:
            await pubsub.subscribe(CHANNEL)  # before the load: nothing published after it is missed
            index = PrefixIndex()
            await load(self.redis, index)
            self.index, expect = index, None
            while not self._stopping:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if msg is None or msg.get("type") != "message":
                    continue
                epoch, seq, ops = _decode.decode(msg["data"])
                if expect is not None and (epoch, seq) != expect:
                    raise RuntimeError(f"index feed: expected {expect}, got {(epoch, seq)}")
                apply(index, ops)
                expect = (epoch, seq + 1)
        finally:
            self.index = None
            try:  # bounded: closing a subscription the client already closed can wait forever
                await asyncio.wait_for(pubsub.aclose(), 1.0)
            except Exception:  # noqa: BLE001 - the connection may be gone with the client already
                pass
