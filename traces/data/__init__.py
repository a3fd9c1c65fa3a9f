"""Shipped traces (JSON), made by MindPipe's own tools; see each file's provenance.

``gpt-mini.cpu.trace.json`` is a CPU trace of the built-in ``gpt-mini`` (micro-batch 4, fp32),
taken with ``mindpipe profile`` on the 2-core CI machine; its provenance records the command,
the torch version and the date.
"""

from __future__ import annotations

import importlib.resources

from mindpipe.traces.errors import ContractError
from mindpipe.traces.trace import Trace


def shipped_trace_names() -> list[str]:
    """Names accepted by :func:`load_shipped_trace` (file names without ``.trace.json``)."""
    root = importlib.resources.files("mindpipe.traces.data")
    return sorted(p.name[: -len(".trace.json")] for p in root.iterdir() if p.name.endswith(".trace.json"))


def load_shipped_trace(name: str) -> Trace:
    """Load a shipped trace by name, e.g. ``"gpt-mini.cpu"``.

    Raises:
        ContractError: unknown name (the message lists the shipped ones).
    """
    if name not in shipped_trace_names():
        raise ContractError(name, None, f"no shipped trace of that name (shipped: {', '.join(shipped_trace_names())})")
    res = importlib.resources.files("mindpipe.traces.data").joinpath(f"{name}.trace.json")
    with importlib.resources.as_file(res) as path:
        return Trace.load(path)
