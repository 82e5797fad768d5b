"""`ray up` cluster YAMLs, their node scripts, and the one-machine node provider.

The YAMLs and scripts/ are data for Ray's cluster launcher; the Python
modules here (local_provider, local_runner, local_node) are the node provider
that cluster/ray_up/local.yaml names, so that `ray up` / `ray down` run the
whole cluster flow on this machine (see docs/deploy.md).
"""
