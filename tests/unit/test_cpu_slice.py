"""common/cpu_slice.py: a slice caps what its processes compute (a real cgroup; needs root), and a quota this
machine cannot give is a config error."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from common import cpu_slice
from common.config import ConfigError, load_config
from tests.unit.test_config import write

needs_cgroups = pytest.mark.skipif(not cpu_slice.available(), reason="no writable cgroup with a CPU controller")

pytestmark = pytest.mark.quiet  # wall-clock bounds: run on a quiet machine (Makefile)

SPIN = "import time\nt = time.time()\nwhile time.time() - t < 1.0: pass\nprint(time.process_time())"


def _cpu_seconds(prefix: list[str]) -> float:
    out = subprocess.run([*prefix, sys.executable, "-c", SPIN], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return float(out.stdout)


@needs_cgroups
def test_a_capped_slice_gets_its_share_and_the_kernel_counts_the_throttling():
    s = cpu_slice.CpuSlice("test-capped")
    try:
        s.limit(0.25)
        assert s.cap() == 0.25
        assert _cpu_seconds(s.prefix()) < 0.4  # a second's spin at a quarter of a core (less when busy)
        assert s.throttled()["throttled"] > 0
        assert s.cpu_seconds() == 0.0  # the spinner has exited: only live processes count
        s.limit(None)
        assert s.cap() is None
    finally:
        s.close()
    assert not s.path.exists()


@needs_cgroups
def test_close_leaves_running_processes_alone_but_uncapped():
    s = cpu_slice.CpuSlice("test-close")
    proc = subprocess.Popen([*s.prefix(), sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for _ in range(50):
            if proc.pid in s.pids():
                break
            subprocess.run(["sleep", "0.05"])
        assert proc.pid in s.pids()
        s.close()
        assert not s.path.exists() and proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
        s.close()


def test_a_quota_this_machine_cannot_give_is_a_config_error_naming_the_field(tmp_path, monkeypatch):
    cfg = load_config(write(tmp_path, "decode:\n  resources: {cpu_quota: 0.5}\n"), environ={})
    assert cfg.decode.resources.cpu_quota == 0.5
    monkeypatch.setattr(cpu_slice, "available", lambda: False)
    with pytest.raises(ConfigError, match=r"in f\.yaml:\n  decode\.resources\.cpu_quota"):
        cpu_slice.check(cfg, "f.yaml")
    cpu_slice.check(load_config(write(tmp_path, "decode: {replicas: 1}\n"), environ={}), "f.yaml")  # none asked
    with pytest.raises(ConfigError, match="decode.resources.cpu_quota"):
        load_config(write(tmp_path, "decode:\n  resources: {cpu_quota: 0}\n"), environ={})


@needs_cgroups
def test_a_slice_counts_the_cpu_time_of_its_live_processes():
    s = cpu_slice.CpuSlice("test-usage")
    spin_then_wait = "import time\nwhile time.process_time() < 0.5: pass\ntime.sleep(30)"
    proc = subprocess.Popen([*s.prefix(), sys.executable, "-c", spin_then_wait])
    try:
        deadline = time.monotonic() + 10
        while s.cpu_seconds() < 0.3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert 0.3 <= s.cpu_seconds() < 5.0
    finally:
        proc.kill()
        proc.wait()
        s.close()
