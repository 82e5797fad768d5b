"""Where a benchmark's result goes: one JSON document on stdout, and optionally a file and a plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable


def emit(doc: dict, out: Path | None, plot_path: Path | None, plot: Callable[[dict, Path], None]) -> None:
    """Prints `doc` as one JSON line; writes it indented to `out` and `plot(doc, plot_path)`, where given."""
    print(json.dumps(doc))
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1))
    if plot_path:
        plot(doc, plot_path)
