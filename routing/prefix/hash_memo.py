"""The block hashes of recent prompts, so a front hashes only what a prompt adds.

An agent's turn resends the whole conversation, and every new session of a
tenant starts with the same system prompt: at 300 blocks (an ~5k-token
prompt) the hash chain was ~0.3 ms of each routing decision (sha256 then) at 64 replicas
(`baton bench scale --part control`), almost all of it for blocks the front
hashed a turn earlier. The memo keeps, per session and per tenant, the last
prompt's packed tokens and hashes; the next prompt reuses the hashes of the
full blocks it shares with that one (compared byte for byte, so a hash is
reused only for the very tokens it was computed from) and hashes the rest,
or, given the hashes some replica holds, only up to the first it does not
hold: a new session's uncached tail waits for its next turn. The values are
exactly `hash_blocks`'s (a leading part of them). Bounded by the tokens it
keeps, least recently used first out.

Pure logic: no clock, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Sequence

from routing.prefix.block_hash import hash_known, pack_tokens

DEFAULT_MAX_TOKENS = 2_000_000  # 16 MB of packed tokens per front
CHUNK_BLOCKS = 32  # the first chunk `hashes` packs and hashes past the reused blocks; each next one doubles


class HashMemo:
    """One front's memo (module docstring): the last prompt's packed tokens and block hashes per
    (tenant, session) and per tenant, at most `max_tokens` tokens in all."""

    def __init__(self, block_size: int, max_tokens: int = DEFAULT_MAX_TOKENS):
        if block_size <= 0 or max_tokens < 0:
            raise ValueError("block_size must be > 0 and max_tokens >= 0")
        self.bs, self.max_bytes = block_size, 8 * max_tokens
        # (packed tokens, hashes as a tuple: ints in tuples are not the cyclic collector's to traverse)
        self._entries: OrderedDict[tuple, tuple[bytes, tuple[int, ...]]] = OrderedDict()
        self._bytes = 0
        self.reused_blocks = 0  # blocks whose hash came from the memo, for tests and metrics
        self.hashed_blocks = 0

    def hashes(self, token_ids: Sequence[int], salt: str, session: str | None = None,
               known: Container[int] | None = None) -> list[int]:
        """`hash_blocks(token_ids, block_size, salt)`, packed and hashed in growing chunks; with
        `known`, only its leading part: up to the first hash not in `known` (`block_hash.hash_known`),
        so a new session's uncached tail costs nothing here (the next turn hashes it, once the
        index holds it). Reads the session's last prompt, else the tenant's
        (`salt`); changes the memo: this prompt, as far as hashed, becomes both."""
        bs, width = self.bs, 8 * self.bs
        n_full = len(token_ids) // bs
        prev = (self._entries.get((salt, session)) if session is not None else None) or self._entries.get((salt,))
        packed, k = self._reusable(token_ids, n_full, prev)
        m = len(packed) // width  # blocks packed so far
        out = list(prev[1][:k]) if k else []
        pos, chunk = k, CHUNK_BLOCKS
        while pos < n_full:
            end = min(n_full, max(pos + chunk, m))
            if end > m:
                packed, m = packed + pack_tokens(token_ids, end * bs, m * bs), end
            tail, whole = hash_known(packed[pos * width:end * width], bs, salt, out[-1] if out else None, known)
            out += tail
            if not whole:
                break
            pos, chunk = end, 2 * chunk
        packed = packed[:len(out) * width]
        self.reused_blocks += k
        self.hashed_blocks += len(out) - k
        kept = tuple(out)
        if session is not None:
            self._put((salt, session), packed, kept)
        self._put((salt,), packed, kept)
        return out

    def _reusable(self, token_ids: Sequence[int], n_full: int, prev: tuple | None) -> tuple[bytes, int]:
        """(the prompt's leading blocks packed, how many of them `prev` holds the hashes of): packed
        and compared in growing chunks up to the first block that differs, so a new session is
        packed only a little past the system prompt it shares with the tenant's last prompt, not
        as far as that prompt went. Changes nothing."""
        if not prev:
            return b"", 0
        bs, width = self.bs, 8 * self.bs
        m, parts, pos, chunk = min(n_full, len(prev[1])), [], 0, CHUNK_BLOCKS
        while pos < m:
            end = min(m, pos + chunk)
            parts.append(pack_tokens(token_ids, end * bs, pos * bs))
            same = _common_blocks(parts[-1], prev[0][pos * width:end * width], width)
            if same < end - pos:
                return b"".join(parts), pos + same
            pos, chunk = end, 2 * chunk
        return b"".join(parts), m

    def _put(self, key: tuple, packed: bytes, hashes: tuple[int, ...]) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= len(old[0])
        if len(packed) > self.max_bytes:
            return
        self._entries[key] = (packed, hashes)
        self._bytes += len(packed)
        while self._bytes > self.max_bytes:
            _, (gone, _) = self._entries.popitem(last=False)
            self._bytes -= len(gone)


def _common_blocks(a: bytes, b: bytes, width: int) -> int:
    """Full blocks of `width` bytes that `a` and `b` share from their start."""
    n = min(len(a), len(b)) // width
    # bytes slices, not memoryviews: a slice copies at memcpy speed and compares with memcmp (0.3 us
    # for 40 kB), where memoryviews compare item by item (19 us).
    if a[:n * width] == b[:n * width]:  # a turn that extends the last one: one comparison
        return n
    lo, hi = 0, n - 1  # the first lo blocks are equal; not all n are
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid * width] == b[:mid * width]:
            lo = mid
        else:
            hi = mid - 1
    return lo
