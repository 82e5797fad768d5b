"""Catalogue models' runtime_envs, made usable by actors the replicas start.

Ray accepts local directories in `py_modules` and `working_dir` only at the
job level: its driver zips and uploads them. The replicas that start a
model's actor (deployments/catalogue/model_actor.py) are not drivers, so the driver
that deploys the application (`baton up`, `baton deploy`) uploads each
catalogue entry's local paths here, with Ray's own helpers (the ones
`ray.init` calls), and hands the replicas a config whose runtime_envs name
the uploaded packages (`gcs://...` URIs) instead.
"""

from __future__ import annotations

import logging

from common.config import BatonConfig

log = logging.getLogger(__name__)


def with_uploaded_envs(cfg: BatonConfig) -> BatonConfig:
    """`cfg` with every catalogue entry's local py_modules and working_dir uploaded to the cluster and
    replaced by their URIs; `cfg` itself when no entry has a runtime_env. Needs a connected Ray driver."""
    if not any(m.runtime_env for m in cfg.models):
        return cfg
    import ray
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    scratch = ray._private.worker.global_worker.node.get_runtime_env_dir_path()
    models = []
    for entry in cfg.models:
        env = dict(entry.runtime_env or {})
        if env:
            env = upload_py_modules_if_needed(env, include_gitignore=True, scratch_dir=scratch, logger=log)
            env = upload_working_dir_if_needed(env, include_gitignore=True, scratch_dir=scratch, logger=log)
            env.pop("excludes", None)
        models.append(entry.model_copy(update={"runtime_env": env or None}))
    return cfg.model_copy(update={"models": models})
