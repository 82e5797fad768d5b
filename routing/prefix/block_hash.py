"""Chained hashes of full token blocks, salted by tenant.

A block's hash covers its parent's hash, its own token ids and the salt, so
equal hashes mean equal prefixes (up to collisions) and two tenants never share
a hash. Only full blocks are hashed: a partial tail block is never cached by
the engine, so it never matches.

The hash function is injected. The default is sha256 of a stable encoding of
``(parent, tokens, salt)`` truncated to 64 bits; to match vLLM's prefix-cache
hashes exactly, pass a function computing vLLM's hash instead.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections.abc import Callable, Sequence

BlockHashFn = Callable[[int | None, tuple[int, ...], str | None], int]


def sha256_block_hash(parent: int | None, tokens: tuple[int, ...], salt: str | None) -> int:
    """Default block hash: sha256 over parent, tokens and salt, first 64 bits."""
    h = hashlib.sha256()
    h.update(b"P" + (struct.pack("<Q", parent) if parent is not None else b"-"))
    h.update(b"S" + (salt.encode("utf-8") if salt is not None else b"-"))
    h.update(b"T" + struct.pack(f"<{len(tokens)}q", *tokens))
    return int.from_bytes(h.digest()[:8], "little")


def hash_blocks(
    token_ids: Sequence[int],
    block_size: int,
    salt: str | None,
    parent: int | None = None,
    hash_fn: BlockHashFn = sha256_block_hash,
) -> list[int]:
    """Return one chained hash per full block of ``token_ids``.

    ``parent`` is the hash of the block before ``token_ids[0]`` (None at the
    start of a prompt). The salt goes into every block, not only the first, so
    a tenant's hashes differ even when the caller continues a chain from a
    parent. Pure: changes nothing.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    n_full = len(token_ids) // block_size
    if hash_fn is sha256_block_hash:
        return _sha256_chain(token_ids, block_size, n_full, salt, parent)
    hashes: list[int] = []
    for i in range(n_full):
        block = tuple(token_ids[i * block_size : (i + 1) * block_size])
        parent = hash_fn(parent, block, salt)
        hashes.append(parent)
    return hashes


def _sha256_chain(token_ids: Sequence[int], block_size: int, n_full: int, salt: str | None,
                  parent: int | None) -> list[int]:
    """`sha256_block_hash` chained over the blocks, the same values, with the tokens packed once
    (a front hashes every prompt: 300 blocks of an 8k-token prompt per decision)."""
    return sha256_packed(pack_tokens(token_ids, n_full * block_size), block_size, salt, parent)


def pack_tokens(token_ids: Sequence[int], n: int) -> bytes:
    """The first `n` token ids as the little-endian int64s that `sha256_packed` hashes (an array's
    C loop: struct.pack of 5k arguments took most of a memo hit's time)."""
    packed = array("q", token_ids[:n])
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def sha256_packed(packed: bytes | memoryview, block_size: int, salt: str | None, parent: int | None) -> list[int]:
    """`hash_blocks` with sha256 over tokens already packed (`pack_tokens`), one hash per full block."""
    salt_t = b"S" + (salt.encode("utf-8") if salt is not None else b"-") + b"T"
    width = 8 * block_size
    sha, from_bytes, out = hashlib.sha256, int.from_bytes, []
    prev = b"P" + (struct.pack("<Q", parent) if parent is not None else b"-")
    for i in range(0, len(packed) // width * width, width):
        digest = sha(prev + salt_t + packed[i:i + width]).digest()[:8]
        out.append(from_bytes(digest, "little"))
        prev = b"P" + digest
    return out
