"""API keys: stored hashed, one tenant per key, added and revoked at run time.

A key is never stored or logged, only its SHA-256 (`sha256:<hex>`). Keys come
from two places:

- `serve.api_keys` in the config (hash -> tenant), fixed for the life of the
  deployment;
- the Redis hash `baton:api_keys` (hash -> tenant), which `baton keys add` and
  `baton keys revoke` change while the stack runs. Every front re-reads it
  every `REFRESH_S`, so a revoked key stops working within that (plus one
  Redis round trip). While Redis is unreachable a front keeps the last set it
  read.

`KeyTable` is the pure lookup; `KeyStore` adds the Redis refresh.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets

REDIS_KEY = "baton:api_keys"
REFRESH_S = 1.0
PREFIX = "sha256:"

log = logging.getLogger(__name__)


def hash_key(key: str) -> str:
    """The stored form of `key`: `sha256:` and the hex digest of its UTF-8 bytes."""
    return PREFIX + hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh random key (256 bits), shown once to whoever created it."""
    return "bk-" + secrets.token_urlsafe(32)


class KeyTable:
    """Key hash -> tenant, from the config and from the last Redis read."""

    def __init__(self, static: dict[str, str]):
        self.static = dict(static)
        self.dynamic: dict[str, str] = {}

    def replace_dynamic(self, keys: dict[str, str]) -> None:
        """Makes `keys` the run-time set; keys absent from it stop working."""
        self.dynamic = dict(keys)

    @property
    def empty(self) -> bool:
        return not self.static and not self.dynamic

    def tenant(self, key: str) -> str | None:
        """The tenant of `key`, or None for a key no one issued (or one revoked)."""
        digest = hash_key(key)
        return self.static.get(digest) or self.dynamic.get(digest)


class KeyStore:
    """A `KeyTable` whose run-time keys follow Redis."""

    def __init__(self, static: dict[str, str], client):
        self.table = KeyTable(static)
        self.client = client
        self.task: asyncio.Task | None = None
        self.loaded = False

    async def refresh(self) -> bool:
        """Re-reads the run-time keys; on a Redis error keeps the last set and returns False."""
        try:
            raw = await self.client.hgetall(REDIS_KEY)
        except Exception as exc:  # noqa: BLE001 - redis errors and timeouts alike
            log.warning("API keys: Redis unreachable (%s); keeping the %d keys read before",
                        type(exc).__name__, len(self.table.dynamic))
            return False
        self.table.replace_dynamic({k.decode(): v.decode() for k, v in raw.items()})
        self.loaded = True
        return True

    async def start(self) -> None:
        """Reads the keys once, then keeps re-reading them every REFRESH_S in the background."""
        await self.refresh()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            await self.refresh()

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()


# -- administration (baton keys) ----------------------------------------------


def add(client, tenant: str) -> str:
    """Issues a key for `tenant` (stored as its hash) and returns the key itself."""
    key = new_key()
    client.hset(REDIS_KEY, hash_key(key), tenant)
    return key


def revoke(client, key_or_hash: str) -> int:
    """Revokes one key, given the key or its `sha256:` hash (or a unique prefix of it); returns 1 or 0."""
    target = key_or_hash if key_or_hash.startswith(PREFIX) else hash_key(key_or_hash)
    stored = [k.decode() for k in client.hkeys(REDIS_KEY)]
    matches = [k for k in stored if k == target] or [k for k in stored if k.startswith(target)]
    if len(matches) != 1:
        return 0
    return client.hdel(REDIS_KEY, matches[0])


def listing(client) -> list[tuple[str, str]]:
    """(hash prefix, tenant) of every run-time key; never a key."""
    raw = client.hgetall(REDIS_KEY)
    return sorted((k.decode()[:len(PREFIX) + 12], v.decode()) for k, v in raw.items())
