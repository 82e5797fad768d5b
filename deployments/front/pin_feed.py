"""Session pins streamed to every front, so a routing decision waits for nothing from Redis.

A front writes a session's pins to Redis (`pin:<pool>:<session>`, with
`routing.pin_ttl_s`) and, in the same pipeline, publishes them on a channel
(`message`). Each front keeps every live pin in its own memory (`LocalPins`): it
subscribes first, then loads the pins Redis holds, then applies every pin
published since it subscribed, in order. A pin is last-writer-wins and every
write is published, so that replay is safe: a session's pin is the last
message's, or the loaded value where no message touched it. A lost connection
makes the front load again; until it has, its decisions read the pins from
Redis (one MGET), as they did before the feed.

What it saves: a pinned turn's MGET of its pins, and a new session's
placement script (request_routing.py places it on the live sessions per
replica this copy counts): at 64 replicas a decision went from 1.4-1.5 ms p50
and 40 Redis commands to 0.5-0.6 ms and about one, written beside it
(`baton bench scale --part control`). What it costs: each front applies
every front's pin writes, one dict update per pool a request used (a kept
pin is written again only once REFRESH of its TTL has passed); at 2,000 new
pins a second across a cluster that is ~2k small updates a second per front,
and memory for every live session (10k sessions: a few MB).
"""

from __future__ import annotations

import asyncio

import msgspec

from deployments.front.shared_view import POOLS
from deployments.kv_index.index_feed import FeedFollower, scan
from routing.prefix import redis_state
from routing.prefix.redis_state import P
from routing.prefix.session_pins import SessionPins

CHANNEL = f"{P}pins:feed"
SWEEP_S = 10.0  # how often expired pins leave the copy (a tenth of their TTL, if shorter)
REFRESH = 0.05  # a kept pin is written again once this share of its TTL has passed since its last write
_decode = msgspec.msgpack.Decoder()
# A kept pin written again (PinWriter), each where its session's key holds no newer pin: every pin
# has the same TTL, so one with more of it left was written later, by another front. KEYS: the
# pins' keys; ARGV[1]: the feed's channel ('' for none), then per key its replica, TTL left (ms),
# pool, session and expires_at. Publishes the pins it wrote, as `message` does, in the same step,
# so no front's copy sees them after a newer one. Returns how many it wrote.
KEEP = """
local out = {}
for i, key in ipairs(KEYS) do
  local a = 2 + (i - 1) * 5
  local ttl = tonumber(ARGV[a + 1])
  if redis.call('PTTL', key) < ttl then
    redis.call('SET', key, ARGV[a], 'PX', ttl)
    out[#out + 1] = {ARGV[a + 2], ARGV[a + 3], ARGV[a], tonumber(ARGV[a + 4])}
  end
end
if #out > 0 and ARGV[1] ~= '' then redis.call('PUBLISH', ARGV[1], cmsgpack.pack(out)) end
return #out
"""


def message(pins: list[tuple[str, str, str, float]]) -> bytes:
    """The feed message for pins written together: (pool, session, replica, expires_at) each, with
    expires_at in wall-clock seconds."""
    return msgspec.msgpack.encode(pins)


class LocalPins(FeedFollower):
    """This front's copy of every live session pin (module docstring). `get` answers only while
    the copy is in step with Redis (`synced`)."""

    def __init__(self, redis, ttl_s: float, clock):
        """`clock`: wall-clock seconds (time.time), the pins' expiry times' clock."""
        super().__init__()
        self.redis, self.ttl_s, self.clock = redis, ttl_s, clock
        self.pins = {pool: SessionPins(ttl_s) for pool in POOLS}
        self.synced = False

    def get(self, pool: str, session: str, now: float) -> str | None:
        """The session's live pin in `pool`, or None. Changes nothing."""
        return self.pins[pool].peek(session, now)

    def fresh(self, pool: str, session: str, now: float) -> bool:
        """Whether the session's pin in `pool` was written less than REFRESH of its TTL ago (its
        expiry is further than the rest)."""
        expires_at = self.pins[pool].expires_at(session)
        return expires_at is not None and expires_at - now > (1 - REFRESH) * self.ttl_s

    def sessions(self, pool: str, replicas) -> dict[str, int]:
        """Live sessions pinned to each of `replicas` in `pool`: what places a new session, as
        redis_state.PLACE counts them from Redis (expired pins count until the next sweep, at most
        a tenth of their TTL). Changes nothing."""
        table = self.pins[pool]
        return {r: table.held(r) for r in replicas}

    def wrote(self, pins: list[tuple[str, str, str, float]]) -> None:
        """Applies this front's own writes at once (the feed brings them back later, unchanged)."""
        if self.synced:
            self._apply(pins)

    def _apply(self, pins) -> None:
        for pool, session, replica, expires_at in pins:
            if pool in self.pins:
                self.pins[pool].put(session, replica, expires_at)

    async def _load(self) -> None:
        """Fills the copy with the pins Redis holds, each until its remaining TTL runs out."""
        self.pins = {pool: SessionPins(self.ttl_s) for pool in POOLS}
        for pool in POOLS:
            prefix = len(f"{P}pin:{pool}:")
            async for keys in scan(self.redis, f"{P}pin:{pool}:*", 1000):
                pipe = self.redis.pipeline(transaction=False)
                for k in keys:
                    pipe.get(k)
                    pipe.pttl(k)
                res = await pipe.execute()
                now = self.clock()
                for k, replica, ttl_ms in zip(keys, res[::2], res[1::2]):
                    if replica is not None and ttl_ms is not None and ttl_ms > 0:
                        name = (k.decode() if isinstance(k, bytes) else k)[prefix:]
                        self.pins[pool].put(name, replica.decode() if isinstance(replica, bytes) else replica,
                                            now + ttl_ms / 1000)

    async def _follow(self) -> None:
        pubsub = self.redis.pubsub()
        try:
            await pubsub.subscribe(CHANNEL)  # before the load: nothing published after it is missed
            await self._load()
            self.synced, swept = True, self.clock()
            while not self._stopping:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if msg is not None and msg.get("type") == "message":
                    self._apply(_decode.decode(msg["data"]))
                if (now := self.clock()) - swept >= min(SWEEP_S, self.ttl_s / 10):
                    swept = now
                    for pins in self.pins.values():
                        pins.expire(now)
        finally:
            self.synced = False
            try:  # bounded: closing a subscription the client already closed can wait forever
                await asyncio.wait_for(pubsub.aclose(), 1.0)
            except Exception:  # noqa: BLE001
                pass


class PinWriter:
    """Runs the pin writes routing decisions queue, without the decision waiting for Redis: all
    queued since the last flush in one pipeline, in order (one each took a connection each: 48 for
    50). Pins a flush could not write (Redis away or restarting) are kept, the latest per session,
    and written again, with what remains of their TTL, before the next flush's own writes, which
    a retry every RETRY_S starts where no decision does; so a session placed or moved during an
    outage keeps its replica after it, on every front (the feed carries them too). Session-set
    writes (placements read from Redis) are not kept: the next placement sweeps those sets. A
    kept pin is written only where Redis holds no newer pin for its session (`KEEP`: another
    front may have placed the session since), and published only then."""

    RETRY_S = 1.0
    MAX_UNWRITTEN = 100_000  # sessions kept while Redis is away, oldest dropped first
    KEEP_CHUNK = 1_000  # kept pins per KEEP call

    def __init__(self, redis, clock, publish: bool, on_error, track):
        """`clock`: wall-clock seconds; `publish`: whether fronts follow pins on the feed;
        `on_error()` counts a failed flush; `track(task)` keeps each flush task until it is done."""
        self.redis, self.clock, self.publish = redis, clock, publish
        self._on_error, self._track = on_error, track
        self._batch: list = []  # (queue, pins) of decisions since the last flush
        self._flusher: asyncio.Future | None = None
        self.unwritten: dict[tuple[str, str], tuple[str, float]] = {}  # (pool, session) -> (replica, expires_at)

    def send(self, queue, pins: list[tuple[str, str, str, float]]) -> None:
        """Queues a decision's writes (`queue(pipe)` adds them) and the pins among them; starts a
        flush unless one runs."""
        self._batch.append((queue, pins))
        if self._flusher is None:
            self._flusher = asyncio.ensure_future(self._flush())
            self._track(self._flusher)

    async def _flush(self) -> None:
        try:
            while self._batch:
                batch, self._batch = self._batch, []
                written = [p for _, pins in batch for p in pins]
                again = self._again({(pool, session) for pool, session, _, _ in written})
                pipe = self.redis.pipeline(transaction=False)
                if again:  # older than this batch's own
                    self._write_kept(pipe, again)
                for queue, _ in batch:
                    queue(pipe)
                try:
                    await pipe.execute()
                except Exception:  # noqa: BLE001 - counted; kept to write again
                    self._on_error()
                    self._keep(written)
                    asyncio.get_running_loop().call_later(self.RETRY_S, self._retry)
                    continue
                for pool, session, _, _ in again + written:
                    self.unwritten.pop((pool, session), None)
        finally:
            self._flusher = None

    def _write_kept(self, pipe, pins: list[tuple[str, str, str, float]]) -> None:
        """Queues KEEP on `pipe` for kept pins, each with what remains of its TTL, KEEP_CHUNK a call
        (a call holds Redis until it returns)."""
        now, channel = self.clock(), CHANNEL if self.publish else ""
        for i in range(0, len(pins), self.KEEP_CHUNK):
            chunk, args = pins[i:i + self.KEEP_CHUNK], [channel]
            for pool, session, replica, expires_at in chunk:
                args += [replica, max(1, int((expires_at - now) * 1000)), pool, session, repr(float(expires_at))]
            keys = [redis_state.pin_key(pool, session) for pool, session, _, _ in chunk]
            pipe.eval(KEEP, len(keys), *keys, *args)  # the text, not its SHA: Redis may just have restarted

    def _again(self, superseded: set) -> list[tuple[str, str, str, float]]:
        """The kept pins still live and not rewritten by this batch; drops the expired ones."""
        now, out = self.clock(), []
        for key, (replica, expires_at) in list(self.unwritten.items()):
            if expires_at <= now:
                del self.unwritten[key]
            elif key not in superseded:
                out.append((*key, replica, expires_at))
        return out

    def _keep(self, pins: list[tuple[str, str, str, float]]) -> None:
        for pool, session, replica, expires_at in pins:
            self.unwritten.pop((pool, session), None)  # the latest last: dropped last
            self.unwritten[(pool, session)] = (replica, expires_at)
        while len(self.unwritten) > self.MAX_UNWRITTEN:
            del self.unwritten[next(iter(self.unwritten))]

    def _retry(self) -> None:
        if self.unwritten and self._flusher is None:
            self.send(lambda pipe: None, [])
