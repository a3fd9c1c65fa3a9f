"""Command-line argument rules every subcommand shares: one-line usage errors and bounded numbers.

argparse reports a bad argument by printing the usage block and a line, then exiting with 2;
:class:`OneLineParser` prints only ``mindpipe: error: command line: <what>`` (the promise of the
README: one line, exit 2). The ``type=`` factories (:func:`count`, :func:`real`, :func:`seed`)
refuse numbers outside a stated range while the arguments are parsed, before any work starts,
so ``--steps 0``, ``--budget 10**12`` or ``--critical-batch nan`` never reach the library.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from typing import NoReturn

from mindpipe.traces.errors import one_line
from mindpipe.traces.limits import limit, shown

MAX_SEED = int(limit("seed"))  # numpy's RandomState (the tuner's BO) takes seeds below 2^32
_INT_RE = re.compile(r"[+-]?[0-9]{1,18}")
_FLOAT_CHARS = 40


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``mindpipe: error: command line: <message>`` and exit 2 (argparse calls this)."""
        prog = self.prog.removeprefix("mindpipe").strip()
        where, helper = (f"{prog}: ", f"mindpipe {prog} --help") if prog else ("", "mindpipe --help")
        sys.stderr.write(one_line(f"mindpipe: error: command line: {where}{message} (see {helper})") + "\n")
        sys.exit(2)


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def count(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number in ``[lo, hi]``."""

    def parse(text: str) -> int:
        t = text.strip()
        if not _INT_RE.fullmatch(t) or not lo <= int(t) <= hi:
            raise argparse.ArgumentTypeError(f"{shown(text)} is not a whole number in [{lo:,}, {hi:,}]")
        return int(t)

    parse.__name__ = "integer"
    return parse


def real(lo: float, hi: float, lo_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""

    def parse(text: str) -> float:
        try:
            value = float(text) if len(text) <= _FLOAT_CHARS else math.nan
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (lo < value if lo_open else lo <= value) and value <= hi
        if not ok:
            bracket = "(" if lo_open else "["
            raise argparse.ArgumentTypeError(f"{shown(text)} is not a finite number in {bracket}{_num(lo)}, {_num(hi)}]")
        return value

    parse.__name__ = "number"
    return parse


def seed() -> Callable[[str], int]:
    """An argparse ``type``: a seed in ``[0, 2^32 − 1]``."""
    return count(0, MAX_SEED)


__all__ = ["MAX_SEED", "OneLineParser", "count", "real", "seed"]
