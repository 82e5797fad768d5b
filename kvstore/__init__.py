"""The KV transfer layer: the Mooncake-backed connector between prefill and decode, the shared
memory pool, the NVMe spill tier (its format, store and disk index), holdings and health."""
