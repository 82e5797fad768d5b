"""vLLM's KV-event wire format, decoded without importing vLLM.

vLLM's publisher (vllm/distributed/kv_events.py) sends an array-like msgspec batch of tagged
events. Importing that module imports vLLM and torch: 10-15 CPU-seconds and about 600 MB in the
indexer's process, which needs neither, paid again by every replacement indexer. These structs
declare, under vLLM's tags, the fields the indexer reads; msgspec skips an event's other fields,
so a vLLM that adds fields still decodes. tests/unit/test_kv_events_schema.py checks each field
against vLLM's own structs and decodes what vLLM's encoder wrote.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the tagged events (vLLM's tag: the class name)."""


class BlockStored(KVCacheEvent):
    block_hashes: list[Any]  # an engine hash: bytes, or int on older engines
    parent_block_hash: Any = None
    token_ids: list[int] = msgspec.field(default_factory=list)
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None  # per block; tuples, as vLLM decodes them


class BlockRemoved(KVCacheEvent):
    block_hashes: list[Any]
    medium: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]
    data_parallel_rank: int | None = None


def decoder() -> msgspec.msgpack.Decoder:
    """A decoder of one published payload into a KVEventBatch."""
    return msgspec.msgpack.Decoder(KVEventBatch)
