"""``mindpipe run PLAN --nproc N --steps S``: train a plan under torchrun (the executor's handler).

Thin re-wiring only, while the executor's command changes on its own branch: the arguments are
:func:`mindpipe.executor.config.add_run_arguments` (torch-free) and the handler is
:func:`mindpipe.executor.launch.cmd_run`, imported only when the command runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``run`` subcommand to ``sub`` and return its parser."""
    from mindpipe.executor.config import add_run_arguments  # torch-free

    p = sub.add_parser("run", help="train a plan with torch.distributed (wraps torchrun) and measure it")
    add_run_arguments(p, launcher=True)
    p.set_defaults(func=cmd_run)
    return p


def cmd_run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Validate the plan, launch torchrun and wait (the executor's :func:`~mindpipe.executor.launch.cmd_run`)."""
    from mindpipe.executor.launch import cmd_run as run_plan

    return run_plan(args, argv)


__all__ = ["add_parser", "cmd_run"]
