"""ManagedProcess children: a process group of their own, in the launcher's session."""

from __future__ import annotations

import os
import sys

from common.processes import ManagedProcess


def test_child_shares_the_session_but_not_the_process_group(tmp_path):
    # A session of its own would be a scheduling group of its own under the kernel's
    # autogroup, which starved Redis and the Mooncake master behind the engines.
    child = ManagedProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(30)"],
                           tmp_path / "sleeper.log")
    child.start()
    try:
        assert os.getsid(child.pid) == os.getsid(0)
        assert os.getpgid(child.pid) == child.pid != os.getpgid(0)
    finally:
        child.stop(timeout=5)
    assert not child.alive()
