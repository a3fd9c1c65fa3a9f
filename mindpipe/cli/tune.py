"""``mindpipe tune``: registered here; the parser and the handler are still :mod:`mindpipe.tuner.cli`'s.

Thin re-wiring only, while the tuner's command changes on its own branch: the parser and the
search are the tuner's, unchanged (torch-free).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``tune`` subcommand (the tuner's arguments) to ``sub`` and return its parser."""
    from mindpipe.tuner.cli import add_parser as add_tune_parser

    p = add_tune_parser(sub)
    p.set_defaults(func=cmd_tune)
    return p


def cmd_tune(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the tuner's command (exit 2, through ContractError, when no plan is feasible)."""
    from mindpipe.tuner.cli import cmd_tune as tune_command

    return tune_command(args, argv)


__all__ = ["add_parser", "cmd_tune"]
