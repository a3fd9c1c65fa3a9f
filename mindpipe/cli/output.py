"""What the subcommands share on the way out: progress on stderr, the command line, a trace's summary.

``--json`` prints exactly one JSON object on stdout and nothing else there; progress and the
names of written files go to stderr.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from mindpipe.traces.summary import format_summary, summarize
from mindpipe.traces.trace import Trace


def stderr(msg: str) -> None:
    """One line of progress on stderr (flushed: the user sees it while the command runs)."""
    print(msg, file=sys.stderr, flush=True)


def command_line(argv: Sequence[str]) -> str:
    """The command as the user typed it, for a trace's provenance."""
    return "mindpipe " + " ".join(shlex.quote(a) for a in argv)


def emit_trace(args: argparse.Namespace, trace: Trace, out: str | None) -> None:
    """Save ``trace`` to ``out`` (if given) and print its summary: a table, or one JSON object with ``--json``."""
    if out:
        trace.save(out)
        stderr(f"wrote {out}")
    if getattr(args, "json", False):
        payload: dict[str, Any] = summarize(trace)
        payload["out"] = out
        print(json.dumps(payload))
    else:
        print(format_summary(trace))


__all__ = ["command_line", "emit_trace", "stderr"]
