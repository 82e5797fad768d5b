"""The command runner of the one-machine cluster: node commands as local processes.

Where Ray's SSHCommandRunner logs in to a node, this runner runs the
command here, with `bash -c`, in the repository root (what `~/baton` is on a
cloud node), in a new session (detached from the caller's terminal, as a
command over SSH is), with the node's environment (`node_environment`):

- `BATON_LOCAL_NODE=<node dir>`: the marker every process of the node
  inherits; `ray stop` and node termination stop exactly the processes that
  carry it (local_node.py);
- `BATON_NODE_DIR=<node dir>`: the node-local state of the node scripts (pid
  files, logs, the Mooncake JSON), and the node's home for file mounts: a
  mount to `~/x` lands in `<node dir>/x` (so `~/ray_bootstrap_config.yaml`,
  which `ray up` mounts on the head, is `$BATON_NODE_DIR/ray_bootstrap_config.yaml`);
- `RAY_TMPDIR=<node dir>`: Ray's temp dir on the node is `<node dir>/ray`,
  as it is /tmp/ray on a machine of its own, so `ray.init("auto")` on the
  head finds this cluster and /tmp/ray is left alone (a worker's `ray start`
  follows the head's temp dir unless told, hence its `--temp-dir`: raylets
  that share a session directory race for the same socket names);
- `PATH` starting with scripts/local_bin (whose `ray` turns `ray stop` into
  local_node's node-scoped stop) and the venv's bin.

Variables that describe the node that launches this one (the head's
monitor launches the workers) are not passed on.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from ray.autoscaler._private.subprocess_output_util import ProcessRunnerError
from ray.autoscaler.command_runner import CommandRunnerInterface

from cluster.ray_up.local_node import MARKER

REPO = Path(__file__).resolve().parents[2]
LOCAL_BIN = REPO / "cluster" / "ray_up" / "scripts" / "local_bin"
# Set per node, or by Ray per command: never inherited from the launching node.
NODE_SCOPED = (MARKER, "BATON_NODE_DIR", "BATON_NODE_ENV", "RAY_TMPDIR", "RAY_HEAD_IP",
               "RAY_CLOUD_INSTANCE_ID", "RAY_NODE_TYPE_NAME", "RAY_CLOUD_INSTANCE_TYPE_NAME",
               "RAY_OVERRIDE_RESOURCES", "RAY_OVERRIDE_LABELS", "RAY_ADDRESS")


def node_environment(node_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every command run on the node in `node_dir`."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in NODE_SCOPED}
    bin_dir = Path(sys.executable).parent
    path = [str(LOCAL_BIN), str(bin_dir)] + [
        p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if p not in (str(LOCAL_BIN), str(bin_dir))]
    env.update({
        MARKER: str(node_dir),
        "BATON_NODE_DIR": str(node_dir),
        "BATON_NODE_ENV": str(node_dir / "node.env"),
        "BATON_HOME": str(REPO),
        "RAY_TMPDIR": str(node_dir),
        "BATON_LOCAL_PYTHON": sys.executable,
        "BATON_LOCAL_RAY": str(bin_dir / "ray"),
        "PATH": os.pathsep.join(path),
    })
    return env


def _exports(variables: dict[str, Any] | None) -> str:
    """Ray's convention for per-command variables (values JSON-encoded)."""
    return "".join(f"export {k}={shlex.quote(json.dumps(v, separators=(',', ':')))};"
                   for k, v in (variables or {}).items())


class LocalCommandRunner(CommandRunnerInterface):
    """Runs a node's commands and file mounts on this machine (no SSH)."""

    def __init__(self, log_prefix: str, node_id: str, provider: Any, node_dir: Path):
        self.log_prefix = log_prefix
        self.node_id = node_id
        self.provider = provider
        self.node_dir = node_dir

    def _env(self) -> dict[str, str]:
        self.node_dir.mkdir(parents=True, exist_ok=True)
        return node_environment(self.node_dir)

    def run(self, cmd: str | None = None, timeout: int = 120, exit_on_fail: bool = False,
            port_forward=None, with_output: bool = False, environment_variables=None,
            run_env: str = "auto", ssh_options_override_ssh_key: str = "",
            shutdown_after_run: bool = False, silent: bool = False) -> str:
        # `timeout` is SSH's connect timeout in Ray's runner: nothing to connect to here.
        # Forwarded ports are this machine's own ports already.
        if cmd is None:  # `ray attach`: an interactive shell on the node
            return str(subprocess.call(["bash", "-i"], env=self._env(), cwd=REPO))
        argv = ["bash", "-c", _exports(environment_variables) + cmd]
        out = self._run(argv, with_output or silent, exit_on_fail)
        if shutdown_after_run:  # `ray exec --stop`: the node goes away after the command
            self.provider.terminate_node(self.node_id)
        return out if with_output else ""

    def _run(self, argv: list[str], capture: bool, exit_on_fail: bool) -> str:
        """Runs argv, echoing its output (stdout and stderr), or with `capture`
        returning its stdout. Waits for the command, not for its output to end:
        daemons it starts may hold the pipe open."""
        proc = subprocess.Popen(argv, env=self._env(), cwd=REPO, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=None if capture else subprocess.STDOUT,
                                start_new_session=True)
        chunks: list[bytes] = []

        def pump() -> None:
            for line in iter(proc.stdout.readline, b""):
                chunks.append(line)
                if not capture:
                    sys.stdout.buffer.write(line)
                    sys.stdout.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        code = proc.wait()
        reader.join(timeout=5)
        out = b"".join(chunks).decode(errors="replace")
        if code != 0:
            if exit_on_fail:
                import click

                raise click.ClickException(f"Command failed ({code}) on {self.node_id}: {argv[-1]}")
            raise ProcessRunnerError("Command failed", "ssh_command_failed", code=code, command=argv)
        return out

    def _node_path(self, target: str) -> Path:
        """`~` on a node is its directory."""
        if target == "~" or target.startswith("~/"):
            return self.node_dir / target[2:]
        return Path(target)

    def run_rsync_up(self, source: str, target: str, options: dict | None = None) -> None:
        self._copy(Path(os.path.expanduser(source)), self._node_path(target), source.endswith("/"))

    def run_rsync_down(self, source: str, target: str, options: dict | None = None) -> None:
        self._copy(self._node_path(source), Path(os.path.expanduser(target)), source.endswith("/"))

    @staticmethod
    def _copy(src: Path, dst: Path, contents: bool) -> None:
        import shutil

        if src.is_dir():
            shutil.copytree(src, dst if contents else dst / src.name, dirs_exist_ok=True, symlinks=True)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)

    def remote_shell_command_str(self) -> str:
        env = node_environment(self.node_dir, base={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        return f"cd {shlex.quote(str(REPO))} && env {assigns} bash"

    def run_init(self, *, as_head: bool, file_mounts: dict, sync_run_yet: bool):
        return None
