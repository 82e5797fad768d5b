"""API keys: hashed storage, one tenant per key, run-time add and revoke through a real Redis."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from common.config import ConfigError, load_config
from deployments.api import api_keys
from deployments.api.api_keys import KeyStore, KeyTable, hash_key


def test_hash_is_sha256_hex_and_keys_are_random():
    assert hash_key("abc") == "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert api_keys.new_key() != api_keys.new_key()
    assert len(api_keys.new_key()) > 40


def test_table_maps_keys_to_tenants_by_hash_only():
    table = KeyTable({hash_key("k1"): "acme"})
    assert table.tenant("k1") == "acme"
    assert table.tenant("k2") is None
    assert table.tenant(hash_key("k1")) is None  # the hash is not a key
    table.replace_dynamic({hash_key("k2"): "globex"})
    assert table.tenant("k2") == "globex" and not table.empty
    table.replace_dynamic({})
    assert table.tenant("k2") is None and table.tenant("k1") == "acme"


def test_config_refuses_plain_keys_and_names_the_field(tmp_path):
    path = tmp_path / "baton.yaml"
    path.write_text("serve:\n  api_keys: {my-secret-key: acme}\n")
    with pytest.raises(ConfigError) as exc:
        load_config(str(path))
    assert "serve.api_keys" in str(exc.value) and "my-secret-key" not in str(exc.value)
    path.write_text(f"serve:\n  api_keys: {{'{hash_key('k')}': acme}}\n  require_api_key: true\n")
    cfg = load_config(str(path))
    assert cfg.serve.api_keys == {hash_key("k"): "acme"} and cfg.serve.require_api_key


def test_add_list_revoke(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.delete(api_keys.REDIS_KEY)
    key = api_keys.add(client, "acme")
    stored = client.hgetall(api_keys.REDIS_KEY)
    assert stored == {hash_key(key).encode(): b"acme"}  # the key itself is nowhere
    [(prefix, tenant)] = api_keys.listing(client)
    assert hash_key(key).startswith(prefix) and tenant == "acme" and key not in prefix
    assert api_keys.revoke(client, "not-a-key") == 0
    assert api_keys.revoke(client, prefix) == 1
    assert client.hlen(api_keys.REDIS_KEY) == 0
    other = api_keys.add(client, "globex")
    assert api_keys.revoke(client, other) == 1  # by the key itself
    client.close()


def test_store_follows_redis_and_keeps_last_set_when_redis_fails(redis_url):
    async def scenario():
        client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=1)
        sync = redis.Redis.from_url(redis_url)
        sync.delete(api_keys.REDIS_KEY)
        key = api_keys.add(sync, "acme")
        store = KeyStore({}, client)
        await store.start()
        assert store.table.tenant(key) == "acme"
        api_keys.revoke(sync, key)
        deadline = time.monotonic() + api_keys.REFRESH_S * 2.5  # the background refresh's period, and room
        while store.table.tenant(key) is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert store.table.tenant(key) is None  # revoked without a restart
        again = api_keys.add(sync, "acme")
        await store.refresh()
        # Redis unreachable: the set read last stays in force.
        # (no retries: the client's default backoff spent 3.5 s on a port nobody listens on)
        store.client = redis.asyncio.Redis(host="127.0.0.1", port=1, socket_timeout=0.2, retry=Retry(NoBackoff(), 0))
        assert await store.refresh() is False
        assert store.table.tenant(again) == "acme"
        store.stop()
        await client.aclose()
        sync.close()

    asyncio.run(scenario())
