"""The secrets a `ray up` cluster is launched with: `baton secrets`.

Two files in ~/.baton/secrets (directory 0700, files 0600), made once on the
machine that runs `ray up` and copied to every node by the cluster YAMLs'
file_mounts:

- `ray_auth_token`: Ray's token authentication (RAY_AUTH_MODE=token,
  RAY_AUTH_TOKEN_PATH), which setup_node.sh turns on for every Ray process
  and driver of the node;
- `redis_password`: Redis's `requirepass` (head_start.sh), read by every Baton
  process through `redis.password_file`.

Existing files are kept, so running it again changes nothing.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

DEFAULT_DIR = Path("~/.baton/secrets")
FILES = ("ray_auth_token", "redis_password")


def ensure(directory: Path = DEFAULT_DIR) -> dict[str, Path]:
    """Creates the missing secret files under `directory`; returns name -> path. Never overwrites."""
    directory = directory.expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    out = {}
    for name in FILES:
        path = directory / name
        if not path.exists() or path.stat().st_size == 0:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        path.chmod(0o600)
        out[name] = path
    return out
