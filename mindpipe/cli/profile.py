"""``mindpipe profile MODEL --out trace.json``: per-layer trace of a GPT on this machine (imports torch)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from mindpipe.cli import loaders
from mindpipe.cli.output import command_line, emit_trace, stderr
from mindpipe.traces.builtin import model_names


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``profile`` subcommand to ``sub`` and return its parser."""
    p = sub.add_parser("profile", help="profile a model layer by layer on this machine's CPU or GPU")
    p.add_argument("model", metavar="MODEL", help=f"JSON file, inline JSON or built-in ({', '.join(model_names())})")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--micro-batch-size", type=int, default=1, help="sequences per micro-batch (default 1)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the model's)")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"], help="parameter/activation dtype")
    p.add_argument("--granularity", default="layer", choices=["layer", "op"], help="layers, or operators inside blocks")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs per layer (default 3)")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per layer; the median is kept (default 10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="trace JSON to write")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_profile)
    return p


def cmd_profile(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Build the model, time every layer, write the trace and print its summary."""
    from mindpipe.traces.profiler import ProfileOptions, profile_model  # imports torch

    model = loaders.model(args.model)
    opts = ProfileOptions(
        micro_batch_size=args.micro_batch_size,
        seq_len=args.seq_len,
        device=args.device,
        dtype=args.dtype,
        granularity=args.granularity,
        warmup=args.warmup,
        repeats=args.repeats,
        seed=args.seed,
    )
    trace = profile_model(model, opts, command=command_line(argv), progress=None if args.quiet else stderr)
    emit_trace(args, trace, args.out)
    return 0


__all__ = ["add_parser", "cmd_profile"]
