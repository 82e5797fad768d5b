"""The prefix index: which engine holds which KV blocks, and the engines' KV events.

Block hashing and its memo, the KVIndex contract and its in-process and Redis
implementations, one request's snapshot of shared state, session pins, and the
translation and sequencing of vLLM's KV events. Pure except ``redis_state`` and
``redis_index``, which drive an injected Redis client.
"""
