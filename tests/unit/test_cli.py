"""The `baton` command rejects a bad config before starting anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
