"""Runs notebooks/pd_ratio.ipynb in SMALL mode against real local stacks.

The notebook is executed from a temporary copy with the parameters injected
after its `parameters` cell, as papermill does, so the committed notebook and
its full-run outputs stay untouched.
"""

from __future__ import annotations

import csv
import os
import signal
import time
from pathlib import Path

import pytest

from common.processes import pid_alive
from common.constants import REPO_ROOT as REPO

NOTEBOOK = REPO / "notebooks" / "pd_ratio.ipynb"
PLOTS = ("pd_sweep.png", "pd_calibration.png", "pd_extrapolation.png")
CELL_TIMEOUT_S = 540  # the sweep cell starts both stacks (about 2 minutes here), with room for one engine start retried


def inject_parameters(nb, params: dict) -> None:
    """Inserts a cell tagged `injected-parameters` right after the `parameters` cell."""
    import nbformat

    index = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    source = "# Parameters injected by the test\n" + "\n".join(f"{k} = {v!r}" for k, v in params.items())
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(index + 1, cell)


def stop_leftover_stacks(stacks_dir: Path) -> list[int]:
    """SIGTERMs any `baton up` whose config lies under ``stacks_dir`` (ours only); returns their PIDs."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"up" in cmdline and any(arg.startswith(str(stacks_dir).encode()) for arg in cmdline):
            found.append(int(proc.name))
            os.kill(int(proc.name), signal.SIGTERM)
    deadline = time.monotonic() + 120
    while any(pid_alive(p) for p in found) and time.monotonic() < deadline:
        time.sleep(1)
    return found


@pytest.mark.e2e
@pytest.mark.timeout(840)
def test_pd_ratio_notebook_small(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    out, stacks = tmp_path / "out", tmp_path / "stacks"
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # SMALL also writes the plots into OUT_DIR, never into docs/results/pd_ratio.
    inject_parameters(nb, {"SMALL": True, "OUT_DIR": str(out), "STACK_DIR": str(stacks)})
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", interrupt_on_timeout=True,
                            resources={"metadata": {"path": str(REPO / "notebooks")}})
    started = time.monotonic()
    try:
        client.execute()
    finally:
        nbformat.write(nb, tmp_path / "pd_ratio.executed.ipynb")  # for a look after a failure
        leftovers = stop_leftover_stacks(stacks)
    elapsed = time.monotonic() - started
    assert leftovers == [], "the notebook left a stack running"

    with open(out / "pd_results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {(r["ratio"], r["workload"]) for r in rows} == {
        (ratio, w) for ratio in ("0:1 colocated", "1:1") for w in ("prefill-heavy", "decode-heavy")}
    assert all(int(r["completed"]) > 0 for r in rows), rows
    with open(out / "pd_extrapolation.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 2 * 2 * 3  # profiles x workloads x cluster sizes
    for name in PLOTS:
        assert (out / name).stat().st_size > 10_000, name
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) == len(PLOTS)
    print(f"SMALL notebook run took {elapsed:.0f} s")
