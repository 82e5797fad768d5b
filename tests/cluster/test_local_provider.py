"""The one-machine node provider's parts, without a Ray cluster (seconds).

cluster/ray_up/local.yaml through Ray's own config handling, the provider's
node bookkeeping as the autoscaler calls it, the command runner, and the
node-scoped `ray stop` and termination, on real processes: a copy of `sleep`
named `raylet` is a Ray process to `ray stop`'s name matching.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml
from ray.autoscaler._private.subprocess_output_util import ProcessRunnerError
from ray.autoscaler.tags import (NODE_KIND_HEAD, NODE_KIND_WORKER, TAG_RAY_NODE_KIND,
                                 TAG_RAY_NODE_STATUS, TAG_RAY_USER_NODE_TYPE)

from cluster.ray_up import local_node
from cluster.ray_up.local_provider import LocalProcessProvider
from common.constants import REPO_ROOT as REPO

LOCAL_YAML = REPO / "cluster" / "ray_up" / "local.yaml"


def test_local_yaml_passes_rays_validation_and_names_the_provider():
    from ray.autoscaler._private.providers import _get_node_provider_cls
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load(LOCAL_YAML.read_text())
    prepared = prepare_config(copy.deepcopy(raw))  # what `ray up` runs; no defaults file involved
    validate_config(prepared)
    assert _get_node_provider_cls(prepared["provider"]) is LocalProcessProvider
    types = prepared["available_node_types"]
    assert types["prefill"]["resources"]["prefill"] == 1 and "accelerator_type:H100" in types["prefill"]["resources"]
    assert types["decode"]["resources"]["decode"] == 1 and "accelerator_type:L4" in types["decode"]["resources"]
    assert types["prefill"]["min_workers"] == types["decode"]["min_workers"] == 1
    head = " ".join(raw["head_start_ray_commands"])
    assert "$BATON_NODE_DIR/ray_bootstrap_config.yaml" in head  # where `ray up` mounts ~/ray_bootstrap_config.yaml
    assert raw["head_start_ray_commands"][0] == raw["worker_start_ray_commands"][0] == "ray stop"


@pytest.fixture
def provider(tmp_path):
    p = LocalProcessProvider({"type": "external", "clusters_dir": str(tmp_path)}, "t")
    yield p
    local_node.stop(p.node_dir(i).as_posix() for i in p.non_terminated_nodes({}))


def _fake_raylet(tmp_path: Path) -> str:
    fake = tmp_path / "raylet"
    if not fake.exists():
        shutil.copy("/bin/sleep", fake)
    return str(fake)


def _wait_gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


def test_nodes_are_shared_through_the_state_file(provider, tmp_path):
    provider.create_node({}, {TAG_RAY_NODE_KIND: NODE_KIND_HEAD, TAG_RAY_USER_NODE_TYPE: "head"}, 1)
    provider.create_node({}, {TAG_RAY_NODE_KIND: NODE_KIND_WORKER, TAG_RAY_USER_NODE_TYPE: "prefill"}, 2)
    other = LocalProcessProvider({"type": "external", "clusters_dir": str(tmp_path)}, "t")  # e.g. `ray down`
    assert sorted(other.non_terminated_nodes({})) == ["head-0", "prefill-1", "prefill-2"]
    assert other.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_HEAD}) == ["head-0"]
    provider.set_node_tags("prefill-1", {TAG_RAY_NODE_STATUS: "up-to-date"})
    assert other.node_tags("prefill-1")[TAG_RAY_NODE_STATUS] == "up-to-date"
    other.terminate_node("prefill-2")
    assert provider.is_terminated("prefill-2") and provider.is_running("prefill-1")
    assert (tmp_path / "baton-t" / "prefill-1").is_dir()


def test_runner_runs_here_with_the_node_environment(provider):
    provider.create_node({}, {TAG_RAY_NODE_KIND: NODE_KIND_HEAD, TAG_RAY_USER_NODE_TYPE: "head"}, 1)
    runner = provider.get_command_runner("", "head-0", {}, "t", subprocess, False)
    node = provider.node_dir("head-0")
    out = runner.run('echo "$BATON_LOCAL_NODE $RAY_TMPDIR $FOO $(pwd)"; command -v ray',
                     with_output=True, environment_variables={"FOO": "bar"})
    line, ray = out.strip().splitlines()
    assert line == f'{node} {node} "bar" {REPO}'  # Ray's runners export values as JSON
    assert ray.endswith("cluster/ray_up/scripts/local_bin/ray")
    with pytest.raises(ProcessRunnerError):
        runner.run("exit 3")
    src = node.parent / "bootstrap.yaml"
    src.write_text("x: 1\n")
    runner.run_rsync_up(str(src), "~/ray_bootstrap_config.yaml")  # what `ray up` mounts on the head
    assert (node / "ray_bootstrap_config.yaml").read_text() == "x: 1\n"


def test_ray_stop_and_termination_touch_only_their_node(provider, tmp_path):
    provider.create_node({}, {TAG_RAY_NODE_KIND: NODE_KIND_WORKER, TAG_RAY_USER_NODE_TYPE: "decode"}, 2)
    fake = _fake_raylet(tmp_path)
    pids = {}
    for node in ("decode-0", "decode-1"):
        runner = provider.get_command_runner("", node, {}, "t", subprocess, False)
        # A daemon as `ray start` leaves it: detached, named raylet; and a non-Ray one.
        pids[node] = [int(runner.run(f"setsid {cmd} >/dev/null 2>&1 & echo $!", with_output=True))
                      for cmd in (f"{fake} 300", "sleep 300")]
    outside = subprocess.Popen([fake, "300"])  # another Ray's raylet on this machine
    try:
        runner = provider.get_command_runner("", "decode-0", {}, "t", subprocess, False)
        out = runner.run("ray stop -g 5", with_output=True)  # through scripts/local_bin/ray
        assert "Stopped 1 process(es)" in out
        raylet0, sleep0 = pids["decode-0"]
        assert _wait_gone(raylet0) and psutil.pid_exists(sleep0)
        assert all(psutil.pid_exists(p) for p in pids["decode-1"]) and outside.poll() is None
        provider.terminate_nodes(["decode-0", "decode-1"])
        assert all(_wait_gone(p) for p in pids["decode-0"] + pids["decode-1"])
        assert outside.poll() is None
        assert provider.non_terminated_nodes({}) == []
    finally:
        outside.kill()
        outside.wait()
