"""`baton bench kv`: loading a prefix from the memory tier, from the disk tier, or recomputing it (kv),
on a prefill/decode pair over a real Mooncake master and store (kv_rig).
"""
