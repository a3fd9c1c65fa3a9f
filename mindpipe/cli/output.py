"""What the subcommands share on the way out: progress on stderr, the command line, a trace's summary.

``--json`` prints exactly one JSON object on stdout and nothing else there (:func:`print_json`);
progress and the names of written files go to stderr. The object is strict JSON: a value that is
not a finite number (an infinite improvement factor when a calibrated error is 0, say) is written
as ``null`` and listed under the top-level key ``non_finite``, which maps its dotted path to what
it was (``"inf"``, ``"-inf"`` or ``"nan"``). ``NaN``/``Infinity`` never appear.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from mindpipe.traces.atomic import check_output, classify
from mindpipe.traces.errors import ContractError
from mindpipe.traces.summary import format_summary, summarize
from mindpipe.traces.trace import Trace


def stderr(msg: str) -> None:
    """One line of progress on stderr (flushed: the user sees it while the command runs)."""
    print(msg, file=sys.stderr, flush=True)


def _file_identity(path: str) -> tuple[str, object] | None:
    """What makes two paths one regular file: its device and inode if it exists, else its real path;
    None for a stream (a device or FIFO), which several outputs may share."""
    kind, where = classify(path)
    if kind == "stream":
        return None
    if kind == "regular":
        st = os.stat(where)
        return "inode", (st.st_dev, st.st_ino)
    return "path", os.path.realpath(where)


def check_outputs(files: Iterable[str | None] = (), dirs: Iterable[str | None] = (),
                  inputs: Iterable[str | None] = ()) -> None:
    """Refuse, before any work starts, the output files and directories the command would refuse to
    write, an output file given twice (the second would replace the first), and an output file that
    is one of the command's ``inputs`` (files it reads: writing would replace what it read).

    Raises:
        ContractError: see :func:`mindpipe.traces.atomic.check_output` (None entries are skipped).
    """
    written: dict[tuple[str, object], str] = {}
    for path in files:
        if path is None:
            continue
        check_output(path)
        key = _file_identity(path)
        if key is not None and key in written:
            also = f" (also as {written[key]})" if written[key] != path else ""
            raise ContractError(path, None, f"is given for two outputs{also}: the second would replace the first")
        if key is not None:
            written[key] = path
    for path in dirs:
        if path is not None:
            check_output(path, directory=True)
    for path in inputs:
        if path is None or not os.path.isfile(path):
            continue
        st = os.stat(path)
        out = written.get(("inode", (st.st_dev, st.st_ino)))
        if out is not None:
            raise ContractError(out, None, f"is also this command's input {path}: writing it would replace what it reads")


def command_line(argv: Sequence[str]) -> str:
    """The command as the user typed it, for a trace's provenance."""
    return "mindpipe " + " ".join(shlex.quote(a) for a in argv)


def _finite(value: Any, path: str, found: dict[str, str]) -> Any:
    """``value`` with every non-finite float replaced by None (recorded in ``found`` by path)."""
    if isinstance(value, float) and not math.isfinite(value):
        found[path or "."] = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return None
    if isinstance(value, dict):
        return {k: _finite(v, f"{path}.{k}" if path else str(k), found) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v, f"{path}[{i}]", found) for i, v in enumerate(value)]
    return value


def json_text(payload: dict[str, Any]) -> str:
    """``payload`` as one line of strict JSON (non-finite numbers → null, listed under ``non_finite``)."""
    found: dict[str, str] = {}
    clean = _finite(payload, "", found)
    if found:
        clean["non_finite"] = found
    return json.dumps(clean, allow_nan=False, default=str)


def print_json(payload: dict[str, Any]) -> None:
    """Print ``payload`` as the one JSON object of ``--json`` on stdout (see the module docstring)."""
    print(json_text(payload), flush=True)


def emit_trace(args: argparse.Namespace, trace: Trace, out: str | None) -> None:
    """Save ``trace`` to ``out`` (if given) and print its summary: a table, or one JSON object with ``--json``."""
    if out:
        trace.save(out)
        stderr(f"wrote {out}")
    if getattr(args, "json", False):
        payload = summarize(trace).to_dict()
        payload["out"] = out
        print_json(payload)
    else:
        print(format_summary(trace))


__all__ = ["check_outputs", "command_line", "emit_trace", "json_text", "print_json", "stderr"]
