"""A Ray node provider whose nodes are directories and processes on this machine.

cluster/ray_up/local.yaml names it (`provider: {type: external, module:
cluster.ray_up.local_provider.LocalProcessProvider}`), so the whole cluster
flow runs on one machine with Ray's own `ray up` / `ray down` / `ray exec`
and Ray's own autoscaler. It replaces Ray's `fake_multinode` provider, which
`ray up` cannot use (the PyPI wheel lacks its defaults file, and it would
log in to the head over SSH), and Ray's `local` provider, which needs SSH
and one IP per node.

- A node is a directory, `<cluster dir>/<node id>`, where the cluster dir is
  `<provider.clusters_dir, default /tmp>/baton-<cluster_name>`. Creating a
  node makes the directory; Ray's updater then runs the YAML's setup and
  start commands for it through LocalCommandRunner (local_runner.py): on
  the head `ray up` does, on the workers the autoscaler on the head does.
  The node type's `resources` reach `ray start` as Ray passes them to every
  provider but `local` (RAY_OVERRIDE_RESOURCES), so fake `prefill` and
  `decode` nodes advertise what cloud nodes of those types would.
- Nodes, their tags and states live in `<cluster dir>/nodes.json`, under a
  file lock: `ray up`, the autoscaler on the head and `ray down` are
  different processes sharing them.
- Terminating a node stops its processes, found by the marker its commands
  carry (local_node.py): Ray's first, in `ray stop`'s order, then the rest
  (Redis, Mooncake). `ray stop`, which `ray down` runs on the head, is
  scoped to the node the same way (scripts/local_bin/ray). Nothing else on
  the machine is touched.

All nodes share this machine's IP, so the autoscaler must tell them apart by
their cloud instance ids (RAY_CLOUD_INSTANCE_ID): autoscaler v2, Ray's
default for `ray up` since 2.50 (do not set RAY_UP_enable_autoscaler_v2=0).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ray.autoscaler.node_provider import NodeProvider
from ray.autoscaler.tags import TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE

from cluster.ray_up import local_node
from cluster.ray_up.local_runner import LocalCommandRunner

RUNNING, TERMINATED = "running", "terminated"


def cluster_dir(provider_config: dict[str, Any], cluster_name: str) -> Path:
    root = Path(os.path.expanduser(provider_config.get("clusters_dir", "/tmp")))
    return root / f"baton-{cluster_name}"


class LocalProcessProvider(NodeProvider):
    """Nodes are directories and the processes their commands start, here."""

    def __init__(self, provider_config: dict[str, Any], cluster_name: str) -> None:
        super().__init__(provider_config, cluster_name)
        self.dir = cluster_dir(provider_config, cluster_name)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._state_file = self.dir / "nodes.json"
        self._lock = threading.RLock()
        self._ip: str | None = None

    # -- state shared by `ray up`, the head's autoscaler and `ray down` --

    @contextmanager
    def _state(self, write: bool = False):
        with self._lock, open(self.dir / "nodes.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX if write else fcntl.LOCK_SH)
            try:
                state = json.loads(self._state_file.read_text()) if self._state_file.exists() else {}
            except ValueError:
                state = {}
            state.setdefault("next_id", 0)
            state.setdefault("nodes", {})
            yield state
            if write:
                tmp = self._state_file.with_suffix(".tmp")
                tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
                os.replace(tmp, self._state_file)

    def _node(self, node_id: str) -> dict[str, Any]:
        with self._state() as s:
            return s["nodes"].get(node_id, {"state": TERMINATED, "tags": {}})

    def node_dir(self, node_id: str) -> Path:
        return self.dir / node_id

    # -- NodeProvider --

    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        with self._state() as s:
            return [i for i, n in s["nodes"].items() if n["state"] == RUNNING
                    and all(n["tags"].get(k) == v for k, v in tag_filters.items())]

    def is_running(self, node_id: str) -> bool:
        return self._node(node_id)["state"] == RUNNING

    def is_terminated(self, node_id: str) -> bool:
        return not self.is_running(node_id)

    def node_tags(self, node_id: str) -> dict[str, str]:
        return dict(self._node(node_id)["tags"])

    def internal_ip(self, node_id: str) -> str:
        if self._ip is None:
            from ray._private.services import get_node_ip_address

            self._ip = get_node_ip_address()
        return self._ip

    external_ip = internal_ip

    def create_node(self, node_config: dict[str, Any], tags: dict[str, str], count: int) -> dict[str, Any]:
        created = {}
        with self._state(write=True) as s:
            for _ in range(count):
                kind = re.sub(r"[^\w-]+", "-", tags.get(TAG_RAY_USER_NODE_TYPE) or tags.get(TAG_RAY_NODE_KIND, "node"))
                node_id = f"{kind}-{s['next_id']}"
                s["next_id"] += 1
                self.node_dir(node_id).mkdir(parents=True, exist_ok=True)
                s["nodes"][node_id] = {"state": RUNNING, "tags": dict(tags), "created": time.time()}
                created[node_id] = s["nodes"][node_id]
        return created

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        with self._state(write=True) as s:
            if node_id in s["nodes"]:
                s["nodes"][node_id]["tags"].update(tags)

    def terminate_node(self, node_id: str) -> None:
        self.terminate_nodes([node_id])

    def terminate_nodes(self, node_ids: list[str]) -> None:
        """Powers the nodes off (their processes, all at once; `local_node.power_off`), then marks
        them terminated."""
        local_node.power_off([str(self.node_dir(i)) for i in node_ids])
        with self._state(write=True) as s:
            for i in node_ids:
                if i in s["nodes"]:
                    s["nodes"][i]["state"] = TERMINATED

    def get_command_runner(self, log_prefix: str, node_id: str, auth_config: dict[str, Any],
                           cluster_name: str, process_runner: Any, use_internal_ip: bool,
                           docker_config: dict[str, Any] | None = None) -> LocalCommandRunner:
        return LocalCommandRunner(log_prefix, node_id, self, self.node_dir(node_id))
