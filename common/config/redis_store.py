"""The `redis` section: where Baton's shared state lives, how it is authenticated and kept."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from common.config.base import ConfigError, _Strict


class RedisConfig(_Strict):
    url: str = Field("redis://127.0.0.1:6390/0", description="Redis used for routing state")
    start_local: bool = Field(True, description="start a redis-server for this URL on `up`")
    password_file: str | None = Field(
        None, description="file holding Redis's password (its `requirepass`), read by every Baton "
        "process that connects; the ray up YAMLs set it (docs/security.md). Env BATON_REDIS_PASSWORD "
        "overrides it.",
    )
    appendfsync: Literal["always", "everysec", "off"] = Field(
        "always", description="persistence of the Redis `up` starts (its append-only file, in the "
        "state directory): `always` writes and fsyncs the file before it replies, so every "
        "acknowledged write (batches, stored responses, keys, usage) survives a Redis kill and a "
        "machine crash, at 0.2-0.35 ms a write for one client instead of 0.03-0.06; `everysec` can "
        "lose acknowledged writes to a kill (Redis holds its file write back for up to 2 s behind a "
        "slow background fsync, and replies meanwhile: 1 of 23 stored responses in a chaos run) and "
        "the last second to a machine crash; `off` keeps nothing (docs/deploy.md)")

    @field_validator("appendfsync", mode="before")
    @classmethod
    def _yaml_off(cls, v):
        return "off" if v is False else v  # YAML reads a bare `off` as false

    def password(self) -> str | None:
        """Redis's password from BATON_REDIS_PASSWORD or `password_file`; None without either."""
        if os.environ.get("BATON_REDIS_PASSWORD"):
            return os.environ["BATON_REDIS_PASSWORD"]
        if self.password_file:
            try:
                return Path(self.password_file).expanduser().read_text().strip() or None
            except OSError as exc:
                raise ConfigError(f"redis.password_file {self.password_file}: {exc.strerror}") from None
        return None

    def client(self, asynchronous: bool = False, reconnect: bool = False, **kwargs):
        """A new redis-py client for `url`, authenticated when a password is set; connects lazily.

        `reconnect`: a command whose pooled connection turns out closed (Redis restarted since
        it was last used) is sent once more on a new connection, instead of failing. redis-py
        clients made from a URL do not retry at all, so after a Redis restart each idle pooled
        connection failed one command. Only for clients whose commands are reads or idempotent
        writes: a write whose reply was lost would be applied twice."""
        import redis
        import redis.asyncio
        import redis.asyncio.retry
        import redis.retry
        from redis.backoff import NoBackoff

        cls = redis.asyncio.Redis if asynchronous else redis.Redis
        if asynchronous:  # a URL's rediss:// or unix:// scheme picks its own connection class over this
            from common.redis_retry import SafeConnection

            kwargs.setdefault("connection_class", SafeConnection)
        if reconnect:
            retry_cls = redis.asyncio.retry.Retry if asynchronous else redis.retry.Retry
            kwargs.setdefault("retry", retry_cls(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)))
        return cls.from_url(self.url, password=self.password(), **kwargs)
