"""``mindpipe import {aicb,torch-profiler} FILE --out trace.json``: convert another tool's trace.

The module is ``import_`` because ``import`` is a Python keyword; the subcommand is ``import``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from mindpipe.cli import loaders
from mindpipe.cli.args import count
from mindpipe.cli.output import check_outputs, command_line, emit_trace
from mindpipe.traces.limits import limit


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``import`` subcommand to ``sub`` and return its parser."""
    p = sub.add_parser("import", help="convert an AICB workload or a torch.profiler Chrome trace")
    p.add_argument("format", choices=["aicb", "torch-profiler"])
    p.add_argument("file", metavar="FILE")
    p.add_argument("--out", required=True, help="trace JSON to write")
    p.add_argument("--model", default=None, help="the model the trace describes (file or built-in name)")
    p.add_argument("--device", default=None, help="device label (default: guessed from the file)")
    p.add_argument("--micro-batch-size", type=count(1, int(limit("micro_batch_size"))), default=None)
    p.add_argument("--seq-len", type=count(1, int(limit("seq_len"))), default=None)
    p.add_argument("--dtype", default="unknown", choices=["fp32", "bf16", "fp16", "unknown"])
    p.add_argument("--group", default="auto", choices=["auto", "record_function", "module"],
                   help="torch-profiler: how to find layers")
    p.add_argument("--pattern", default=None, metavar="GLOB",
                   help="torch-profiler: globs selecting the layer ranges by name (Block_*, attn*|mlp*)")
    p.add_argument("--steps", type=count(1, 10**6), default=None,
                   help="torch-profiler: what to divide the summed times by (default: the ProfilerStep#N ranges, or "
                        "the layers' runs where each ran several times per step: one micro-batch's times)")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.set_defaults(func=cmd_import)
    return p


def cmd_import(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Convert ``FILE`` with the importer of its format, write the trace and print its summary."""
    check_outputs([args.out])
    common = {
        "device": args.device,
        "model": loaders.model(args.model) if args.model else None,
        "micro_batch_size": args.micro_batch_size,
        "seq_len": args.seq_len,
        "dtype": args.dtype,
        "command": command_line(argv),
    }
    if args.format == "aicb":
        from mindpipe.traces.importers.aicb import import_aicb

        trace = import_aicb(args.file, **common)
    else:
        from mindpipe.traces.importers.torch_profiler import import_torch_profiler

        trace = import_torch_profiler(args.file, group=args.group, pattern=args.pattern, steps=args.steps, **common)
    emit_trace(args, trace, args.out)
    return 0


__all__ = ["add_parser", "cmd_import"]
