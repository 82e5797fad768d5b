"""The KV indexer: engine KV events in, the shared prefix index in Redis out.

One Serve replica binds a ZMQ SUB socket that every engine's KV-event
publisher connects to (topic = replica id), translates each event into Baton's tenant-salted block hashes
(routing/prefix/event_translator.py) and writes them to Redis, where every ingress
replica reads them. Blocks an engine saved into Mooncake are recorded under
the pseudo-replica `STORE_REPLICA` until the engine that saved them reports
that no store tier holds them (kvstore/holdings.py). A replica whose heartbeat goes stale is removed
from the index, so the router forgets a dead replica's blocks.

Every batch is applied once and in order (routing/prefix/event_sequence.py): a gap in
an engine's sequence numbers is filled from the engine's replay buffer
(deployments/kv_index/event_replay.py); when it cannot be, or the engine restarted,
the replica's holdings are forgotten rather than kept wrong. The translator's
maps and each replica's next batch are saved with the index
(deployments/kv_index/indexer_state.py), so a replacement indexer replays only
what was published while none ran.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter

import redis
from ray import serve

from common.config import BatonConfig
from common.constants import STORE_REPLICA
from deployments.kv_index import indexer_state
from deployments.kv_index.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, decoder
from deployments.kv_index.event_replay import replay
from deployments.kv_index.index_feed import FeedWriter
from routing.prefix.event_sequence import SequenceTracker, Step, replay_complete
from routing.prefix.event_translator import EventTranslator, chains
from routing.prefix.redis_index import RedisIndex
from routing.prefix.redis_state import INDEX_EPOCH_KEY, INDEXER_STATS_KEY, Registry, registry_key

LOCAL_MEDIA = (None, "GPU")
POLL_MS = 200
MAX_DRAIN = 512  # event batches applied per Redis round trip, at most
SWEEP_S = 1.0
AWAY_S = 0.1  # how often Redis is checked while it does not answer


class EventLoop:
    """Subscriber thread: one bound SUB socket, registry sweeps, event application."""

    def __init__(self, cfg: BatonConfig):
        import zmq

        r = cfg.routing
        self.cfg = cfg
        self.redis = cfg.redis.client(socket_timeout=5)
        # Redis, every front's copy (index_feed.py), and this loop's own state after each flush.
        self.index = RedisIndex(self.redis)
        self.writer = FeedWriter(self.index, then=self._save)
        self.timeout_s = r.replica_timeout_s
        self.block_size = cfg.model.block_size
        self.translator = EventTranslator(self.block_size, journal=[])
        self.decoder = decoder()
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.bind(f"tcp://{r.events_host}:{r.events_port}")
        self.known: set[str] = set()  # replicas with blocks in the index
        self.applied: Counter = Counter()
        self.dropped: Counter = Counter()
        self.seqs = SequenceTracker()
        self.gaps: Counter = Counter()  # gaps seen in a replica's stream
        self.replayed: Counter = Counter()  # batches recovered from a replica's replay buffer
        self.resyncs: Counter = Counter()  # holdings forgotten: engine restarted, or a gap not recoverable
        self.evicted: Counter = Counter()  # blocks an engine reported removed
        self.redis_losses = 0  # times Redis came back without the index, or restarted
        self.redis_run: str | None = None  # Redis's run id: a new one means it restarted
        self.unwritten: set[str] = set()  # replicas with batches applied here whose writes Redis may lack
        self.rewrites: Counter = Counter()  # rebuilds of those, once Redis answered again
        self.endpoints: dict[str, str] = {}  # replica -> its engine's replay socket
        self.moved: set[str] = set()  # replicas whose next batch number changed since the last save
        self.resumed: Counter = Counter()  # replicas taken over from a previous indexer's saved state
        self._resume()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="baton-kv-indexer", daemon=True)
        self.thread.start()

    @contextlib.contextmanager
    def _batch(self):
        """Queues the block's updates for one flush, unless a batch is open already."""
        if self.writer.batched:
            yield
            return
        self.writer.begin()
        try:
            yield
        finally:
            self.writer.flush()

    def _save(self, pipe) -> None:
        """Queues the translator's journal and the moved replicas' positions after a flush's updates."""
        ops = self.translator.journal[:]
        self.translator.journal.clear()
        positions = {r: (self.seqs.expected[r], self.endpoints.get(r)) if r in self.seqs.expected else None
                     for r in self.moved}
        self.moved.clear()
        indexer_state.queue(self.index, pipe, ops, positions)

    def _resume(self) -> None:
        """Takes over the state a previous indexer saved while Redis still holds its index: the
        translator's maps and each replica's next batch, so that only batches published since are
        replayed. A replica gone from the registry, or whose engine now answers replays on another
        socket (a new engine process), is forgotten instead. Redis away: starts empty, as before."""
        try:
            if not self.redis.exists(INDEX_EPOCH_KEY):
                return  # a first start, or a Redis that lost its data
            saved = indexer_state.load(self.redis)
            live = self._registered()
            self.translator.restore_store(saved.store)
            with self._batch():
                for replica, (nxt, endpoint) in saved.seqs.items():
                    self.translator.restore(replica, saved.maps.get(replica, {}))
                    now_at = live.get(replica, {}).get("events_replay")
                    if replica in live and endpoint in (None, now_at):
                        self.seqs.applied(replica, nxt - 1)
                        self.known.add(replica)
                        if now_at:
                            self.endpoints[replica] = now_at
                        self.resumed[replica] += 1
                    else:
                        self._forget(replica)
                        self.moved.add(replica)
        except redis.RedisError:
            self.translator = EventTranslator(self.block_size, journal=[])
            self.seqs, self.known, self.resumed = SequenceTracker(), set(), Counter()

    def _sweep(self) -> None:
        """Forgets replicas whose heartbeat went stale (their blocks and entry); notes the others' replay sockets."""
        now = time.time()
        for pool in ("prefill", "decode"):
            for replica, info in Registry.entries(self.redis.hgetall(registry_key(pool))).items():
                if info.get("events_replay"):
                    self.endpoints[replica] = info["events_replay"]
                if now - info["ts"] > self.timeout_s:
                    self.redis.hdel(registry_key(pool), replica)
                    with self._batch():
                        self._forget(replica)
                        self.known.discard(replica)
                        self.seqs.forget(replica)
                        self.moved.add(replica)
                    self.endpoints.pop(replica, None)

    def _check_redis(self) -> None:
        """Rebuilds what Redis lost: every replica after a restart (the index gone, or the stale
        copy its last file rewrite took), else the replicas whose writes it missed while away.

        The index, and its epoch key, stay out of Redis's append-only file
        (routing/prefix/redis_index.py `UNLOGGED`): a restart drops the key, or
        loads the copy, which Redis's new run id tells. Each replica, and the
        store's holdings, are rewritten from this indexer's own maps (`_rewrite`),
        which saw every batch and keep each block's parent: the index as it was,
        links included, without replaying engines' buffers (which rarely reach
        back to batch 0; while the indexer first fetched them, a 16-replica chaos
        run's index was exact on fewer requests after each Redis kill). Replicas
        a stale copy names that this indexer no longer tracks are forgotten.
        """
        run_id = self.redis.info("server").get("run_id")
        restarted = self.redis_run not in (None, run_id)  # noted once all is rebuilt, at the end
        if restarted:
            self.index.restarted()
        epoch = self.index.unlogged(None, "SET", INDEX_EPOCH_KEY, str(time.time()), "NX")
        lost = bool(epoch and self.seqs.expected) or restarted  # the whole index, or a stale copy of it
        if lost:
            self.redis_losses += 1
            self.unwritten = set(self.seqs.expected)
            self._forget_stale()
        rewritten = lost or bool(self.unwritten)
        while self.unwritten:
            replica = next(iter(self.unwritten))
            with self._batch():
                self._rewrite(replica)
                self.moved.add(replica)  # its saved position went with the data, or with the failed write
            self.unwritten.discard(replica)
            self.rewrites[replica] += 1
        if rewritten:
            with self._batch():
                self._rewrite(STORE_REPLICA)
        self.redis_run = run_id

    def _forget_stale(self) -> None:
        """Forgets the replicas a stale copy of the index (or of this loop's saved positions)
        names that this indexer no longer tracks."""
        saved = {k.decode() if isinstance(k, bytes) else k for k in self.redis.hkeys(indexer_state.SEQ_KEY)}
        stale = (set(self.index.replicas()) | saved) - set(self.seqs.expected) - {STORE_REPLICA}
        with self._batch():
            for replica in sorted(stale):
                self._forget(replica)
                self.moved.add(replica)

    def _rewrite(self, holder: str) -> None:
        """Makes the index's holdings of `holder` (a replica, or the store) what this indexer's
        maps say, and journals that replica's map again (its journal went with the failed write).
        Blocks the index lacked join with their parent links (the maps keep each block's parent),
        so fan-out comes back too. Called inside a batch: the index is read before anything is queued."""
        held = self.translator.store_holdings() if holder == STORE_REPLICA else self.translator.holdings(holder)
        self.writer.flush()  # what the batch holds so far is in Redis before the read
        had = self.index.held(holder)
        self.writer.begin()
        self.writer.apply_removed(holder, sorted(had - held))
        parents = {} if holder == STORE_REPLICA else self.translator.parents(holder)
        for parent, chain in chains(held - had, parents):
            self.writer.apply_stored(holder, chain, parent)
        if holder != STORE_REPLICA:
            self.translator.rejournal(holder)

    def _forget(self, replica: str) -> None:
        """Removes everything the index says `replica` holds, and the store holdings only it
        vouched for (nobody else would report their eviction)."""
        self.translator.cleared(replica)
        self.writer.apply_cleared(replica)
        self.writer.apply_removed(STORE_REPLICA, self.translator.store_forget(replica))

    def _replay_endpoint(self, replica: str) -> str | None:
        """Where `replica`'s engine answers replays: from its registry entry, remembered
        (a Redis that lost its data has no entries until the next heartbeats)."""
        if replica not in self.endpoints:
            info = self._registered().get(replica)
            if info and info.get("events_replay"):
                self.endpoints[replica] = info["events_replay"]
        return self.endpoints.get(replica)

    def _registered(self) -> dict[str, dict]:
        """Every registry entry of both pools, by replica; reads Redis only."""
        out: dict[str, dict] = {}
        for pool in ("prefill", "decode"):
            out.update(Registry.entries(self.redis.hgetall(registry_key(pool))))
        return out

    def _receive(self, replica: str, seq: int, payload: bytes) -> None:
        """Applies batch `seq` of `replica`, first filling any gap before it (in one flush)."""
        verdict = self.seqs.observe(replica, seq)
        if verdict.step is Step.STALE:
            return
        with self._batch():
            if verdict.step is Step.RESTART:
                self._forget(replica)
                self.resyncs[replica] += 1
            elif verdict.step is Step.GAP:
                self.gaps[replica] += 1
                self._fill(replica, verdict.missing_from, seq)
            self._apply(replica, payload)
            self.seqs.applied(replica, seq)
            self.moved.add(replica)

    def _fill(self, replica: str, start: int, seq: int) -> None:
        """Applies batches start..seq-1 from the engine's buffer, or forgets the replica's holdings."""
        batches = self._replayed(replica, start, seq)
        if batches is None:
            # Lost for good: an index that misses blocks only under-predicts,
            # one that keeps removed blocks mis-routes.
            self._forget(replica)
            self.resyncs[replica] += 1
            return
        self._apply_all(replica, batches)

    def _replayed(self, replica: str, start: int, seq: int) -> dict[int, bytes] | None:
        """Batches start..seq-1 from the engine's replay buffer, in order; None when it cannot
        give all of them. Changes nothing."""
        endpoint = self._replay_endpoint(replica)
        got = replay(self.ctx, endpoint, start) if endpoint else None
        batches = dict(sorted((s, p) for s, p in got or [] if start <= s < seq))
        return batches if got is not None and replay_complete(start, seq, list(batches)) else None

    def _apply_all(self, replica: str, batches: dict[int, bytes]) -> None:
        for payload in batches.values():
            self._apply(replica, payload)
        self.replayed[replica] += len(batches)

    def _apply(self, replica: str, payload: bytes) -> None:
        self.known.add(replica)
        for ev in self.decoder.decode(payload).events:
            if isinstance(ev, BlockStored):
                if ev.medium in LOCAL_MEDIA:
                    t = self.translator.stored(replica, ev.block_hashes, ev.parent_block_hash,
                                               ev.token_ids, ev.extra_keys)
                    if t is None:
                        self.dropped[replica] += 1
                        continue
                    self.writer.apply_stored(replica, t.hashes, t.parent)
                else:  # saved into the Mooncake store by this (prefill) engine
                    self.writer.apply_stored(STORE_REPLICA, self.translator.store_stored(replica, ev.block_hashes), None)
            elif isinstance(ev, BlockRemoved):
                if ev.medium in LOCAL_MEDIA:
                    self.evicted[replica] += len(ev.block_hashes)
                    self.writer.apply_removed(replica, self.translator.removed(replica, ev.block_hashes))
                else:  # this engine found that no store tier holds these any more
                    gone = self.translator.store_removed(ev.block_hashes)
                    self.evicted[STORE_REPLICA] += len(gone)
                    self.writer.apply_removed(STORE_REPLICA, gone)
            elif isinstance(ev, AllBlocksCleared):
                self.translator.cleared(replica)
                self.writer.apply_cleared(replica)
            self.applied[replica] += 1

    def _run(self) -> None:
        last_sweep, away = 0.0, False
        while not self._stop.is_set():
            # After a failed Redis call, Redis is checked (and what it lost rebuilt) every AWAY_S until it
            # answers, not at the next sweep: a restarted Redis lacks the index (and the scripts a flush
            # calls by SHA), and routing under-predicts until the rebuild. Events are still drained
            # meanwhile, into this loop's maps (their replicas noted `unwritten`), so none waits in the
            # socket past its high-water mark.
            if away or time.monotonic() - last_sweep > SWEEP_S:
                try:
                    self._check_redis()
                    self._sweep()
                    # unlogged, as the index: no fsync stalls Redis for counters rewritten every second
                    indexer_state.unlogged_hset(self.index, None, INDEXER_STATS_KEY, self.totals())
                    last_sweep, away = time.monotonic(), False
                except redis.RedisError:
                    away = True
            try:
                if self.sock.poll(AWAY_S * 1000 if away else POLL_MS):
                    self._drain()
            except redis.RedisError:
                away = True
                time.sleep(AWAY_S)  # a Redis that answers but fails every write is not retried in a tight loop

    def _drain(self) -> None:
        """Applies the batches waiting on the socket (up to MAX_DRAIN) with one Redis round trip;
        when that fails, their replicas are noted for a rebuild (`unwritten`)."""
        import zmq

        touched: set[str] = set()
        self.writer.begin()
        try:
            try:
                for _ in range(MAX_DRAIN):
                    try:
                        topic, seq, payload = self.sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    touched.add(topic.decode())
                    self._receive(topic.decode(), int.from_bytes(seq, "big"), payload)
            finally:
                self.writer.flush()
        except redis.RedisError:
            self.unwritten |= touched
            raise

    def totals(self) -> dict[str, int]:
        """Counts over all replicas (what /metrics and `baton status` show); changes nothing."""
        return {"applied_events": sum(self.applied.values()), "dropped_events": sum(self.dropped.values()),
                "evicted_blocks": sum(self.evicted.values()), "gaps": sum(self.gaps.values()),
                "replayed_batches": sum(self.replayed.values()), "resyncs": sum(self.resyncs.values()),
                "redis_losses": self.redis_losses, "rewrites": sum(self.rewrites.values()),
                "resumed": sum(self.resumed.values())}

    def stop(self) -> None:
        self._stop.set()


# Serve's drain before a replica stops waits `graceful_shutdown_wait_loop_s` (2 s by default) for
# requests on their way to it; the indexer's only handle calls are `stats`, and it stops last, after
# the engine pools (2 s of every `baton down` went to that wait).
@serve.deployment(name="kv_indexer", num_replicas=1, ray_actor_options={"num_cpus": 0},
                  graceful_shutdown_wait_loop_s=0.2)
class KVIndexer:
    def __init__(self, cfg: dict):
        self.loop = EventLoop(BatonConfig.model_validate(cfg))

    def stats(self) -> dict:
        """Per replica: events applied and dropped, stream gaps, batches replayed, resyncs, whether it
        was resumed from a previous indexer's state, and the next batch number expected; changes nothing."""
        lp = self.loop
        return {"applied": dict(lp.applied), "dropped": dict(lp.dropped), "gaps": dict(lp.gaps),
                "replayed": dict(lp.replayed), "resyncs": dict(lp.resyncs), "resumed": dict(lp.resumed),
                "next_seq": dict(lp.seqs.expected),
                "replicas": sorted(lp.known)}

    async def check_health(self) -> None:
        if not self.loop.thread.is_alive():
            raise RuntimeError("KV indexer thread died")

    def __del__(self):
        loop = getattr(self, "loop", None)
        if loop is not None:
            loop.stop()
