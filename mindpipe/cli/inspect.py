"""``mindpipe inspect TRACE [--model M]``: a trace's per-layer table, checked against a model."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from mindpipe.cli import loaders
from mindpipe.cli.output import emit_trace, stderr
from mindpipe.traces.errors import ContractError
from mindpipe.traces.supernet import Supernet


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``inspect`` subcommand to ``sub`` and return its parser."""
    p = sub.add_parser("inspect", help="summarise a trace file and check it against a model")
    p.add_argument("trace", metavar="TRACE", help="trace file or shipped trace name (e.g. gpt-mini.cpu)")
    p.add_argument("--model", default=None, help="fail unless the trace was taken for this model")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.set_defaults(func=cmd_inspect)
    return p


def cmd_inspect(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Load the trace (refusing one taken for another ``--model``) and print its summary."""
    net = loaders.network(args.model) if args.model else None
    if isinstance(net, Supernet):  # a per-candidate trace is checked against its supernet
        from mindpipe.simulator.subnet_costs import check_candidate_trace

        trace = loaders.trace(args.trace)
        check_candidate_trace(trace, net, source=args.trace)
    else:
        trace = loaders.trace(args.trace, net)
        if net is not None and trace.supernet is not None:
            raise ContractError(args.trace, "model", f"the trace was taken for the supernet {trace.supernet.label}, "
                                f"not for {net.label}")
    if net is not None and trace.model is None and trace.supernet is None:  # nothing compared: said, not passed
        stderr(f"mindpipe: note: {args.trace} records no model (e.g. imported without --model): "
               f"not checked against {args.model}")
    emit_trace(args, trace, None)
    return 0


__all__ = ["add_parser", "cmd_inspect"]
