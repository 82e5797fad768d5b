"""The shared KV index's writer side: the KV indexer (engine KV events in, the index in Redis out),
asking a publisher to replay missed batches (event_replay), the index streamed to every front
(index_feed), the indexer's saved state (indexer_state), and vLLM's event format read without
importing vLLM (kv_events).
"""
