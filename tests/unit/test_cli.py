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
from bench.peers import _Peer
from cli.main import interrupt_on_sigterm
from common.processes import free_ports

interrupt_on_sigterm()
port = free_ports(1)[0]
peer = _Peer([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], port, Path(sys.argv[1]), timeout_s=30)
peer.ready_path = "/"
with peer:
    print(peer.proc.pid, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
"""


def test_a_bench_stopped_by_sigterm_stops_the_server_it_started(tmp_path):
    """`baton bench` turns SIGTERM into an interrupt, so a peer server (as `vllm serve` in bench
    serve) is stopped on the way out instead of outliving the bench."""
    import psutil

    out = subprocess.run([sys.executable, "-c", STOPPED_BY_SIGTERM, str(tmp_path / "peer.log")],
                         capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert out.returncode != 0 and "KeyboardInterrupt" in out.stderr, out.stderr
    child = int(out.stdout.split()[0])
    try:
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    finally:
        if psutil.pid_exists(child):  # left running: end it (by its PID) before failing
            psutil.Process(child).kill()
