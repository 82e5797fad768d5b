"""The timed executor's KV connector: the store's part of a disaggregated hop, without the bytes.

A simulated engine has no KV to move, so Baton's own connector (kvstore/connector.py,
vLLM's MooncakeStoreConnector underneath) cannot run on one. This connector keeps
everything of the hop but the bytes, against the real Mooncake store:

- a prefill engine (`kv_producer`, `kv_both`) saves a finished request's full prompt
  blocks on a background thread, as MooncakeStoreConnector does: the blocks the store
  lacks are put as one small object each, keyed by vLLM's block hash, once the profile's
  transfer time for their tokens has passed; then they are published as `BlockStored`
  with medium "cpu", as the real connector publishes them, so the router's index learns
  what the store holds;
- an engine that looks up (`enable_lookup`, on by default) asks the store which of a new
  request's leading blocks it has (one `batch_is_exist` in the scheduler's loop, as the
  real lookup) and has the scheduler load them asynchronously, as the real connector does
  by default: the request waits while the engine steps the others, and the timed executor
  reports its KV received once the profile's transfer time for those tokens has passed
  (the loads of one engine queue on its one link);
- `watch` and `pending` answer the prefill replica's `watch_kv_saves` and
  `pending_kv_saves` (actors/openai_app.py), as actors/kv_probe.py answers them
  for the real connector.

Chosen by actors/engine_args.py in place of BatonStoreConnector wherever an engine runs
the timed executor. It runs in the engine core's process only (the executor has no
workers), on the scheduler's side. A benchmark instrument, as the executor is.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from vllm.distributed.kv_events import BlockStored
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

from actors.sim.profile import DEFAULT, GpuProfile
from common.constants import NO_LOOKUP

logger = init_logger(__name__)

ACTIVE: list[TimedStoreConnector] = []  # this process's connectors, for the executor's `pending_kv_saves`


class TimedStoreMeta(KVConnectorMetadata):
    """The loads one scheduler step starts: request id -> prompt tokens taken from the store."""

    def __init__(self, loads: dict[str, int]) -> None:
        self.loads = loads


def leading_hit(present: list, num_tokens: int, block_size: int) -> int:
    """Prompt tokens a store that has `present` (one truth value per leading block, in
    order) can give a request of `num_tokens`: the run of present blocks from the first,
    below the request's end, so that its last token is computed and sampled (the real
    lookup's rule). Pure."""
    run = next((i for i, p in enumerate(present) if not p), len(present))
    if run * block_size >= num_tokens:
        run = (num_tokens - 1) // block_size
    return run * block_size


class TimedStoreConnector(KVConnectorBase_V1):
    """vLLM's KV connector interface over the real Mooncake store, bytes replaced by the
    profile's transfer time (module docstring)."""

    def __init__(self, vllm_config, role, kv_cache_config=None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        extra = ktc.kv_connector_extra_config or {}
        opts = (vllm_config.additional_config or {}).get("baton_sim", {})
        self.profile = GpuProfile.load(opts.get("profile", DEFAULT))
        self.speedup = float(opts.get("speedup", 1.0))
        self.bs = vllm_config.cache_config.block_size
        self.saves = ktc.kv_role in ("kv_producer", "kv_both")
        self.lookups = bool(extra.get("enable_lookup", True))
        self.prefix = f"baton-sim/{vllm_config.model_config.served_model_name}/{self.bs}/"
        self._loading: dict[str, int] = {}
        self._events: list[BlockStored] = []
        self._pending: dict[str, int] = {}
        self._push = None  # the replica's save watch, once it asked (watch)
        self._lock = threading.Lock()
        self.store = self._saver = None
        if role == KVConnectorRole.SCHEDULER:
            self.store = _mooncake()
            self._saver = ThreadPoolExecutor(1, thread_name_prefix="timed-kv-save")
            ACTIVE.append(self)

    def _key(self, block_hash) -> str:
        return self.prefix + bytes(block_hash).hex()

    # --- the scheduler's side -----------------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        """Tokens past `num_computed_tokens` the store can give `request`, loaded asynchronously (the
        request waits for them while the engine steps the others: vLLM's `load_async` default); none
        without asking where its params carry `NO_LOOKUP`."""
        if (not self.lookups or request.num_tokens < self.bs
                or (getattr(request, "kv_transfer_params", None) or {}).get(NO_LOOKUP)):
            return 0, False
        hashes = request.block_hashes[:request.num_tokens // self.bs]
        try:
            present = self.store.batch_is_exist([self._key(h) for h in hashes])
        except Exception as exc:  # noqa: BLE001 - as the real lookup: a store away is no hit
            logger.warning("timed store lookup failed: %s", exc)
            return 0, False
        hit = leading_hit([p == 1 for p in present], request.num_tokens, self.bs) - num_computed_tokens
        return (hit, True) if hit > 0 else (0, False)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        """Notes the load this step starts for `request`, if any."""
        if num_external_tokens > 0:
            self._loading[request.request_id] = num_external_tokens

    def build_connector_meta(self, scheduler_output) -> TimedStoreMeta:
        """The loads this step starts, for the executor (which reports each as received once the
        profile's transfer time has passed); starts the next step's."""
        meta, self._loading = TimedStoreMeta(self._loading), {}
        return meta

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, None]:
        """Queues the save of a producer's finished prompt (its full blocks); the blocks are freed
        now, as the real connector's saves do not hold them either."""
        if self.saves and self._saver is not None:
            n = request.num_prompt_tokens // self.bs
            if n:
                with self._lock:
                    self._pending[request.request_id] = self._pending.get(request.request_id, 0) + 1
                self._saver.submit(self._save, request.request_id, list(request.block_hashes[:n]))
        return False, None

    def take_events(self):
        """The store's `BlockStored` events since the last call."""
        with self._lock:
            events, self._events = self._events, []
        return events

    def watch(self, address: str) -> bool:
        """From now on pushes a request's id to `address` (a ZMQ PULL socket, actors/save_watch.py)
        each time its last queued save ends, as the real connector's worker does
        (actors/kv_probe.py). False (nothing changed) where this engine saves nothing."""
        if not self.saves:
            return False
        import zmq

        sock = zmq.Context.instance().socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.connect(address)
        with self._lock:
            old, self._push = self._push, sock
        if old is not None:
            old.close()
        return True

    def pending(self, request_id: str) -> int:
        """Queued saves of `request_id` (the front's id, or vLLM's with its suffix)."""
        prefix = request_id + "-"
        with self._lock:
            return sum(n for r, n in self._pending.items() if r == request_id or r.startswith(prefix))

    def _save(self, request_id: str, hashes: list) -> None:
        try:
            keys = [self._key(h) for h in hashes]
            missing = [i for i, p in enumerate(self.store.batch_is_exist(keys)) if p != 1]
            if missing:
                time.sleep(self.profile.kv_transfer_s(len(missing) * self.bs) / self.speedup)
                codes = self.store.put_batch([keys[i] for i in missing], [b"\x01"] * len(missing))
                if codes != 0:
                    logger.warning("timed store: put of %d blocks returned %s", len(missing), codes)
                    return
                with self._lock:
                    self._events.append(BlockStored(
                        block_hashes=[maybe_convert_block_hash(hashes[i]) for i in missing],
                        parent_block_hash=maybe_convert_block_hash(hashes[missing[0] - 1]) if missing[0] else None,
                        token_ids=[], block_size=self.bs, lora_id=None, medium="cpu", lora_name=None))
        except Exception as exc:  # noqa: BLE001 - a save that fails is a store miss later, as in the real one
            logger.warning("timed store save failed: %s", exc)
        finally:
            with self._lock:
                left = self._pending.get(request_id, 1) - 1
                if left > 0:
                    self._pending[request_id] = left
                else:
                    self._pending.pop(request_id, None)
                push = self._push if left <= 0 else None
            if push is not None:
                _tell(push, request_id)

    # --- the worker's side: there is no worker; the executor reads the metadata itself ---------

    def start_load_kv(self, forward_context, **kwargs) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        pass

    def wait_for_save(self) -> None:
        pass

    def shutdown(self) -> None:
        if self in ACTIVE:
            ACTIVE.remove(self)
        if self._saver is not None:
            self._saver.shutdown(wait=False, cancel_futures=True)
        if self.store is not None:
            self.store.close()


def _tell(sock, request_id: str) -> None:
    """Pushes `request_id`'s saved news from the saving thread (the only one that sends)."""
    import zmq

    try:
        sock.send_string(request_id, zmq.NOBLOCK)
    except zmq.ZMQError:
        pass  # the replica still asks with pending_kv_saves


def _mooncake():
    """A Mooncake store client set up as vLLM's store connector sets up its own
    (MOONCAKE_CONFIG_PATH, kvstore/mooncake.py writes it)."""
    from mooncake.store import MooncakeDistributedStore
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import rdma_utils
    from vllm.distributed.mooncake_store import MooncakeStoreConfig, setup_mooncake_store
    from vllm.utils.network_utils import get_ip

    store = MooncakeDistributedStore()
    host = rdma_utils.get_requester_local_hostname(get_ip())
    setup_mooncake_store(store, MooncakeStoreConfig.load_from_config(), host)
    return store
