"""Progress lines for long operations: numbered steps and a live wait line.

On a terminal the wait line redraws in place with a spinner; otherwise it
prints a plain line every few seconds, so CI logs stay readable.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

_FRAMES = "|/-\\"


class Progress:
    def __init__(self, total: int, out=sys.stdout):
        self.total, self.n, self.out = total, 0, out
        self.tty = hasattr(out, "isatty") and out.isatty()

    def _print(self, text: str, end: str = "\n") -> None:
        self.out.write(text + end)
        self.out.flush()

    @contextmanager
    def step(self, title: str) -> Iterator[None]:
        """Prints `[n/total] title ...` then `ok (1.2s)` or `FAILED`."""
        self.n += 1
        start = time.monotonic()
        self._print(f"[{self.n}/{self.total}] {title} ...", end="" if self.tty else "\n")
        try:
            yield
        except BaseException:
            self._print(" FAILED" if self.tty else f"[{self.n}/{self.total}] {title}: FAILED")
            raise
        took = time.monotonic() - start
        self._print(f" ok ({took:.1f}s)" if self.tty else f"[{self.n}/{self.total}] {title}: ok ({took:.1f}s)")

    def wait(self, what: str, poll: Callable[[], tuple[bool, str]], timeout: float,
             interval: float = 0.5, plain_every: float = 10.0) -> None:
        """Calls `poll` until it returns (True, _), showing its detail live.

        Raises TimeoutError after `timeout` seconds with the last detail.
        """
        start = time.monotonic()
        last_plain = 0.0
        i = 0
        detail = ""
        while True:
            done, detail = poll()
            elapsed = time.monotonic() - start
            if done:
                if self.tty:
                    self._print("\r\033[K", end="")
                return
            if elapsed > timeout:
                if self.tty:
                    self._print("")
                raise TimeoutError(f"{what} not ready after {timeout:.0f}s: {detail}")
            if self.tty:
                self._print(f"\r\033[K    {_FRAMES[i % 4]} {what}: {detail} ({elapsed:.0f}s)", end="")
            elif elapsed - last_plain >= plain_every:
                last_plain = elapsed
                self._print(f"    ... {what}: {detail} ({elapsed:.0f}s)")
            i += 1
            time.sleep(interval)
