"""The model identity that every stored KV object is addressed under.

A block hash says which tokens (and which tenant's salt) a KV block holds; it
does not say which model, dtype, block size or layer layout produced it. The
identity digest goes into every Mooncake key (vLLM's `cache_prefix`) and into
every spill file, so KV made by another model or configuration is never found,
let alone loaded. Pure: no vLLM or torch import.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelIdentity:
    model: str  # served name and the checkpoint's config digest
    dtype: str  # activation dtype of the KV cache
    kv_cache_dtype: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    layer_layout: str  # KV-cache groups: spec type and layer names
    parallel: str  # tp/pp sizes: each rank stores its own shard

    @property
    def digest(self) -> str:
        """32 hex characters; equal iff every field is equal."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.blake2b(blob, digest_size=16).hexdigest()


def config_digest(config_json: str) -> str:
    """Short digest of a checkpoint's config.json text (architecture, sizes, vocab)."""
    return hashlib.blake2b(config_json.encode(), digest_size=8).hexdigest()
