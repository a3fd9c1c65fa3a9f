"""Child processes that do not outlive the process that started them (Linux; elsewhere a no-op).

Used by the executor's ranks (:mod:`mindpipe.executor.rundir`) and the tuner's worker processes
(:mod:`mindpipe.tuner.sweep`): a parent killed outright (SIGKILL, the OOM killer) runs no cleanup
of its own, so each child asks the kernel to end it when its parent goes. This module does not
import torch.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (``PR_SET_PDEATHSIG``, Linux; a
    no-op elsewhere), and exit at once if the parent (pid ``parent``, default: the current one)
    is already gone."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid() if parent is None else parent
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the prctl took effect
            os._exit(1)


__all__ = ["die_with_parent"]
