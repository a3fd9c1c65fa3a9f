"""A dependency-free progress bar on stderr (``[#####.....] 12/60 simulations, best …``).

On a terminal it redraws one line; otherwise (logs, CI) it prints a line every tenth of the
budget, so captured stderr stays short, and on closing the last state if that line was not printed
(a sweep whose space runs out before its budget would otherwise leave an early line last).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """Callable as the sweep's ``progress(simulations, budget, best)`` hook."""

    def __init__(self, label: str, unit: str, stream: TextIO | None = None, width: int = 30) -> None:
        self.label, self.unit, self.width = label, unit, width
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self._last_tenth = -1
        self._drawn = False
        self._pending: str | None = None  # the latest line a log has not printed

    def __call__(self, done: int, total: int, best: float | None) -> None:
        """Redraw (terminal) or print a line at each new tenth of the budget."""
        frac = min(1.0, done / total) if total else 1.0
        filled = round(frac * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        best_s = f"best {best:.5g} {self.unit}" if best is not None else "no feasible plan yet"
        line = f"{self.label} [{bar}] {done}/{total} simulations, {best_s}, {time.monotonic() - self.start:.0f} s"
        if self.tty:
            self.stream.write("\r" + line)
            self._drawn = True
        else:
            tenth = int(frac * 10)
            if tenth == self._last_tenth:
                self._pending = line
                return
            self._last_tenth = tenth
            self._pending = None
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the redrawn line, or print the last state a log has not had."""
        if self.tty and self._drawn:
            self.stream.write("\n")
            self._drawn = False
            self.stream.flush()
        elif self._pending is not None:
            self.stream.write(self._pending + "\n")
            self._pending = None
            self.stream.flush()


__all__ = ["ProgressBar"]
