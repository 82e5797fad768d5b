"""Launching Baton: the local stack and its launcher, `ray up` configs (ray_up/), deploy, rollout,
status and secrets, the loopback shim (loopback/), and the default model's training and
evaluation (default_model/)."""
