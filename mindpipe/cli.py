"""The ``mindpipe`` command line: thin wiring from subcommands to library calls.

Every input problem is reported as one line ``mindpipe: error: <file>: <key>: <rule>`` on stderr
with exit code 2, never a traceback. ``--json`` prints exactly one JSON object on stdout;
progress always goes to stderr. torch is imported only by the subcommands that need it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

from mindpipe import __version__
from traces.builtin import load_model, model_names
from traces.errors import ContractError
from traces.summary import format_summary, summarize
from traces.trace import Trace

EXIT_USAGE = 2


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _command_line(argv: Sequence[str]) -> str:
    return "mindpipe " + " ".join(shlex.quote(a) for a in argv)


def _emit(args: argparse.Namespace, trace: Trace, out: str | None) -> None:
    if out:
        trace.save(out)
        _stderr(f"wrote {out}")
    if getattr(args, "json", False):
        payload: dict[str, Any] = summarize(trace)
        payload["out"] = out
        print(json.dumps(payload))
    else:
        print(format_summary(trace))


def cmd_profile(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``mindpipe profile MODEL``: per-layer trace of the GPT model on this machine."""
    from traces.profiler import ProfileOptions, profile_model  # imports torch

    model = load_model(args.model)
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
    trace = profile_model(model, opts, command=_command_line(argv), progress=None if args.quiet else _stderr)
    _emit(args, trace, args.out)
    return 0


def cmd_import(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``mindpipe import {aicb,torch-profiler} FILE``: convert another tool's trace."""
    model = load_model(args.model) if args.model else None
    common = {
        "device": args.device,
        "model": model,
        "micro_batch_size": args.micro_batch_size,
        "seq_len": args.seq_len,
        "dtype": args.dtype,
        "command": _command_line(argv),
    }
    if args.format == "aicb":
        from traces.importers.aicb import import_aicb

        trace = import_aicb(args.file, **common)
    else:
        from traces.importers.torch_profiler import import_torch_profiler

        trace = import_torch_profiler(args.file, group=args.group, pattern=args.pattern, steps=args.steps, **common)
    _emit(args, trace, args.out)
    return 0


def cmd_inspect(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``mindpipe inspect TRACE``: summary table; checks the trace against ``--model``."""
    trace = Trace.load(args.trace)
    if args.model:
        trace.check_model(load_model(args.model), source=args.trace)
    _emit(args, trace, None)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    p = argparse.ArgumentParser(prog="mindpipe", description="Plan, simulate and run 4D-parallel training.")
    p.add_argument("--version", action="version", version=f"mindpipe {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    prof = sub.add_parser("profile", help="profile a model layer by layer on this machine's CPU or GPU")
    prof.add_argument("model", metavar="MODEL", help=f"JSON file, inline JSON or built-in ({', '.join(model_names())})")
    prof.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    prof.add_argument("--micro-batch-size", type=int, default=1, help="sequences per micro-batch (default 1)")
    prof.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the model's)")
    prof.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"], help="parameter/activation dtype")
    prof.add_argument("--granularity", default="layer", choices=["layer", "op"], help="layers, or operators inside blocks")
    prof.add_argument("--warmup", type=int, default=3, help="untimed runs per layer (default 3)")
    prof.add_argument("--repeats", type=int, default=10, help="timed runs per layer; the median is kept (default 10)")
    prof.add_argument("--seed", type=int, default=0)
    prof.add_argument("--out", required=True, help="trace JSON to write")
    prof.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    prof.add_argument("--quiet", action="store_true", help="no progress on stderr")
    prof.set_defaults(func=cmd_profile)

    imp = sub.add_parser("import", help="convert an AICB workload or a torch.profiler Chrome trace")
    imp.add_argument("format", choices=["aicb", "torch-profiler"])
    imp.add_argument("file", metavar="FILE")
    imp.add_argument("--out", required=True, help="trace JSON to write")
    imp.add_argument("--model", default=None, help="the model the trace describes (file or built-in name)")
    imp.add_argument("--device", default=None, help="device label (default: guessed from the file)")
    imp.add_argument("--micro-batch-size", type=int, default=None)
    imp.add_argument("--seq-len", type=int, default=None)
    imp.add_argument("--dtype", default="unknown", choices=["fp32", "bf16", "fp16", "unknown"])
    imp.add_argument("--group", default="auto", choices=["auto", "record_function", "module"], help="torch-profiler: how to find layers")
    imp.add_argument("--pattern", default=None, help="torch-profiler: regex selecting the layer ranges")
    imp.add_argument("--steps", type=int, default=None, help="torch-profiler: profiled steps to divide by")
    imp.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    imp.set_defaults(func=cmd_import)

    ins = sub.add_parser("inspect", help="summarise a trace file and check it against a model")
    ins.add_argument("trace", metavar="TRACE")
    ins.add_argument("--model", default=None, help="fail unless the trace was taken for this model")
    ins.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    ins.set_defaults(func=cmd_inspect)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mindpipe`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace, Sequence[str]], int] = args.func
    try:
        return func(args, argv)
    except ContractError as e:
        _stderr(f"mindpipe: error: {e}")
        return EXIT_USAGE
    except OSError as e:
        _stderr(f"mindpipe: error: {getattr(e, 'filename', '') or ''}: {e.strerror or e}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        _stderr("mindpipe: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
