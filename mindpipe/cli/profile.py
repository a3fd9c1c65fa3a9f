"""``mindpipe profile MODEL --out trace.json``: per-layer trace of a GPT on this machine (imports torch)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from mindpipe.cli import loaders
from mindpipe.cli.args import count, seed
from mindpipe.cli.output import check_outputs, command_line, emit_trace, stderr
from mindpipe.traces.builtin import load_network, model_names
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import limit
from mindpipe.traces.supernet import Supernet
from mindpipe.traces.trace import PROFILE_DTYPES

MAX_REPEATS = 10_000  # timed or untimed runs per layer


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``profile`` subcommand to ``sub`` and return its parser."""
    p = sub.add_parser("profile", help="profile a model layer by layer on this machine's CPU or GPU")
    p.add_argument("model", metavar="MODEL", help=f"JSON file, inline JSON or built-in ({', '.join(model_names())}, or a supernet)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--micro-batch-size", type=count(1, int(limit("micro_batch_size"))), default=1,
                   help="sequences per micro-batch (default 1)")
    p.add_argument("--seq-len", type=count(1, int(limit("seq_len"))), default=None,
                   help="tokens per sequence (default: the model's)")
    p.add_argument("--dtype", default="fp32", choices=list(PROFILE_DTYPES), help="parameter/activation dtype")
    p.add_argument("--granularity", default="layer", choices=["layer", "op"], help="layers, or operators inside blocks")
    p.add_argument("--flash-attention", action="store_true",
                   help="run the attention core as one fused kernel, as plans with flash_attention=true do "
                        "(layer granularity; recorded in the trace)")
    p.add_argument("--warmup", type=count(0, MAX_REPEATS), default=3, help="untimed runs per layer (default 3)")
    p.add_argument("--repeats", type=count(1, MAX_REPEATS), default=10,
                   help="timed runs per layer; the median is kept (default 10)")
    p.add_argument("--seed", type=seed(), default=0)
    p.add_argument("--out", required=True, help="trace JSON to write")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_profile)
    return p


def profile_bytes(model: Model, micro_batch_size: int, seq_len: int | None, dtype: str) -> float:
    """Memory a profile of ``model`` needs at least: weights and gradients of every parameter, and
    the activations one micro-batch keeps through a whole forward+backward step (the profiler
    times such a step), by the simulator's memory model (Korthikanti et al. 2022)."""
    from mindpipe.simulator.costs import DTYPE_BYTES
    from mindpipe.simulator.memory import (
        activation_bytes_per_layer,
        embedding_activation_bytes,
        head_activation_bytes,
    )

    plan = Plan(micro_batch_size=micro_batch_size, global_batch_size=micro_batch_size, precision=dtype)
    activations = (model.num_layers * activation_bytes_per_layer(model, plan, seq_len=seq_len)
                   + embedding_activation_bytes(model, plan, seq_len=seq_len)
                   + head_activation_bytes(model, plan, seq_len=seq_len))
    return 2.0 * DTYPE_BYTES[dtype] * model.param_count() + activations


def available_bytes(device: str) -> tuple[float, str]:
    """Free memory of ``device`` (``cpu``: the OS's available RAM; ``cuda[:N]``: the GPU's free memory)."""
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            free, _ = torch.cuda.mem_get_info(torch.device(device))
            return float(free), f"{device} has"
    import psutil

    return float(psutil.virtual_memory().available), "this machine has"


def check_memory(model: Model, source: str, micro_batch_size: int, seq_len: int | None = None, dtype: str = "fp32",
                 device: str = "cpu") -> None:
    """Refuse a profile that cannot fit in memory, before the model is built (``profile``, and ``demo``'s first step).

    Raises:
        ContractError: ``gpt3-175b: needs about 1594 GiB to profile ..., this machine has 3.2 GiB available``.
    """
    need = profile_bytes(model, micro_batch_size, seq_len, dtype)
    have, where = available_bytes(device)
    if need > have:
        gib = 2**30
        raise ContractError(source, None, (
            f"needs about {need / gib:,.1f} GiB to profile ({model.param_count():,} parameters × "
            f"{dtype} weights and gradients, plus one micro-batch's activations); {where} "
            f"{have / gib:,.1f} GiB available"))


def cmd_profile(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Build the model, time every layer, write the trace and print its summary."""
    check_outputs([args.out])
    net = load_network(args.model)
    if isinstance(net, Supernet):
        return _profile_supernet(args, argv, net)
    model = loaders.model(args.model)
    check_memory(model, args.model, args.micro_batch_size, args.seq_len, args.dtype, args.device)
    from mindpipe.traces.profiler import ProfileOptions, profile_model  # imports torch

    opts = ProfileOptions(
        micro_batch_size=args.micro_batch_size,
        seq_len=args.seq_len,
        device=args.device,
        dtype=args.dtype,
        granularity=args.granularity,
        flash_attention=args.flash_attention,
        warmup=args.warmup,
        repeats=args.repeats,
        seed=args.seed,
    )
    trace = profile_model(model, opts, command=command_line(argv), progress=None if args.quiet else stderr)
    emit_trace(args, trace, args.out)
    return 0


def _profile_supernet(args: argparse.Namespace, argv: Sequence[str], net: Supernet) -> int:
    """Every candidate operator, the embedding and the head (``granularity`` is ``candidate``)."""
    if args.granularity != "layer":
        raise ContractError("command line", "granularity", "a supernet is profiled per candidate operator; "
                            "leave --granularity out")
    if args.flash_attention:  # a supernet's candidates run as they are defined; the flag would be ignored
        raise ContractError("command line", "flash_attention", "--flash-attention applies to GPT and Llama models; "
                            "a supernet's attention candidates run as the supernet defines them: leave it out")
    from mindpipe.traces.profiler import ProfileOptions, profile_supernet  # imports torch

    opts = ProfileOptions(micro_batch_size=args.micro_batch_size, seq_len=args.seq_len, device=args.device,
                          dtype=args.dtype, warmup=args.warmup, repeats=args.repeats, seed=args.seed)
    trace = profile_supernet(net, opts, command=command_line(argv), progress=None if args.quiet else stderr)
    emit_trace(args, trace, args.out)
    return 0


__all__ = ["add_parser", "available_bytes", "check_memory", "cmd_profile", "profile_bytes"]
