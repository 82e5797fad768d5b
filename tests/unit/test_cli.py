"""The `baton` command: it rejects a bad config before starting anything, and a stopped bench
stops what it started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from common.constants import REPO_ROOT

BATON = Path(sys.executable).parent / "baton"


def test_up_with_bad_config_names_field_and_file_and_starts_nothing(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\ndecode:\n  replicas: zero\n")
    out = subprocess.run([str(BATON), "--config", str(cfg), "up"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2
    assert "decode.replicas" in out.stderr and str(cfg) in out.stderr
    assert not (tmp_path / "state").exists()


def test_status_when_not_running(tmp_path):
    cfg = tmp_path / "ok.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\n")
    out = subprocess.run([str(BATON), "--config", str(cfg), "status", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and '"running": false' in out.stdout


STOPPED_BY_SIGTERM = """
import os, signal, sys, time
from pathlib import Path
from bench.common.peers import _Peer
from cli.main import interrupt_on_sigterm
from common.processes import free_ports

interrupt_on_sigterm()
port = free_ports(1)[0]
# The server starts a child of its own first (as vllm serve starts its engine core), and prints its PID.
server = ("import runpy, subprocess, sys; kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
          f"print(kid.pid, flush=True); sys.argv = ['http.server', '{port}', '--bind', '127.0.0.1']; "
          "runpy.run_module('http.server', run_name='__main__')")
peer = _Peer([sys.executable, "-c", server], port, Path(sys.argv[1]), timeout_s=30)
peer.ready_path = "/"
with peer:
    print(peer.proc.pid, open(sys.argv[1]).read().split()[0], flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
"""


def test_a_bench_stopped_by_sigterm_stops_the_server_it_started(tmp_path):
    """`baton bench` turns SIGTERM into an interrupt, so a peer server (as `vllm serve` in bench
    serve) and what it started are stopped on the way out instead of outliving the bench."""
    import psutil

    out = subprocess.run([sys.executable, "-c", STOPPED_BY_SIGTERM, str(tmp_path / "peer.log")],
                         capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert out.returncode != 0 and "KeyboardInterrupt" in out.stderr, out.stderr
    started = [int(pid) for pid in out.stdout.split()[:2]]  # the server and the child it started
    try:
        for pid in started:
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid
    finally:
        for pid in started:
            if psutil.pid_exists(pid):  # left running: end it (by its PID) before failing
                psutil.Process(pid).kill()
