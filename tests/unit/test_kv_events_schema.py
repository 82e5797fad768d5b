"""The indexer's copy of vLLM's KV-event wire format (deployments/kv_index/kv_events.py) decodes
what vLLM's own structs encode, field for field, so the indexer need not import vLLM."""

from __future__ import annotations

import msgspec

from deployments.kv_index import kv_events as ours


def test_each_field_is_one_of_vllms_with_its_tag():
    from vllm.distributed import kv_events as theirs

    for name in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
        mine, vllm_cls = getattr(ours, name), getattr(theirs, name)
        assert set(mine.__struct_fields__) <= set(vllm_cls.__struct_fields__), name
        assert (mine.__struct_config__.tag, mine.__struct_config__.tag_field) == \
            (vllm_cls.__struct_config__.tag, vllm_cls.__struct_config__.tag_field), name
    # the batch is array-like: its fields are read by position
    n = len(ours.KVEventBatch.__struct_fields__)
    assert theirs.KVEventBatch.__struct_fields__[:n] == ours.KVEventBatch.__struct_fields__
    assert theirs.KVEventBatch.__struct_config__.array_like


def test_a_batch_vllm_encodes_decodes_to_the_same_values():
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

    sent = KVEventBatch(ts=12.5, data_parallel_rank=1, events=[
        BlockStored(block_hashes=[b"\x01" * 32, 7], parent_block_hash=b"\x02" * 32, token_ids=[1, 2, 3, 4],
                    block_size=2, lora_id=None, medium="GPU", lora_name="adapter", extra_keys=[("salt",), None],
                    group_idx=3),
        BlockStored(block_hashes=[9], parent_block_hash=None, token_ids=[5, 6], block_size=2, lora_id=None,
                    medium="CPU", lora_name=None),
        BlockRemoved(block_hashes=[b"\x01" * 32], medium=None, group_idx=1),
        AllBlocksCleared(),
    ])
    got = ours.decoder().decode(msgspec.msgpack.encode(sent))
    assert (got.ts, got.data_parallel_rank) == (12.5, 1)
    assert [type(e).__name__ for e in got.events] == [type(e).__name__ for e in sent.events]
    for mine, theirs in zip(got.events, sent.events):
        for field in mine.__struct_fields__:
            assert getattr(mine, field) == getattr(theirs, field), (type(mine).__name__, field)
