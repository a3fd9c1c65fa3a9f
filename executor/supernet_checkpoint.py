"""Checkpoints of a supernet run, taken at a drained segment boundary.

A supernet run drains its pipeline every ``--checkpoint-every`` subnets; then no subnet is in
flight, and the state is each stage's parameters (every candidate) and optimizer state, plus the
next subnet id — the "step" of the checkpoint — and the partition the stages had then (an online
repartition, :mod:`mindpipe.executor.supernet_repartition`, may have moved layers; a resumed run
builds its stages with that partition). Each rank writes ``stage<S>-dp<R>.pt`` with
``torch.save`` and reads it back with ``torch.load(weights_only=True)`` (tensors and plain
containers only: no code is unpickled). The directory, manifest and ``latest.json`` record are
:mod:`mindpipe.executor.checkpoint_trust`'s, so the same ownership, permission and sha256 checks
run before any byte is read; resuming needs the same supernet (the record's model) and the same
dp × pp split (the file names).

The optimizer's per-parameter state is kept as torch keeps it, keyed by the parameter's position:
parameters that never stepped have none, so a resumed AdamW counts its steps exactly as an
uninterrupted one (torch.distributed.checkpoint's helpers would initialise every parameter's state).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from mindpipe.executor import checkpoint_trust as trust
from mindpipe.traces.errors import ContractError
from torch import nn


def _file(directory: str | Path, step: int, stage: int, dp_rank: int) -> Path:
    return trust.step_dir(directory, step) / f"stage{stage}-dp{dp_rank}.pt"


def save(directory: str | Path, step: int, module: nn.Module, optimizer: torch.optim.Optimizer, stage: int,
         dp_rank: int, model: dict[str, Any], partition: list[int], keep: int = 0) -> None:
    """Write the checkpoint after ``step`` subnets (collective: every rank calls it)."""
    root = Path(directory)
    path = trust.step_dir(root, step)
    if dist.get_rank() == 0:
        trust.begin_save(root, step)
        path.mkdir(mode=0o700, exist_ok=True)
    dist.barrier()
    torch.save({"model": module.state_dict(), "optim": optimizer.state_dict(), "next_subnet": step,
                "partition": list(partition)},
               _file(root, step, stage, dp_rank))
    dist.barrier()
    if dist.get_rank() == 0:
        trust.finish_save(root, step, model, 1, keep)
    dist.barrier()


def read(directory: str | Path, stage: int, dp_rank: int, model: dict[str, Any]) -> dict[str, Any]:
    """The newest checkpoint of this rank, after the trust checks (apply it with :func:`load`).

    Raises:
        ContractError: see :func:`mindpipe.executor.checkpoint_trust.check_resume`, or a checkpoint
            of another dp × pp split.
    """
    step = trust.check_resume(directory, model, 1, None)
    f = _file(directory, step, stage, dp_rank)
    if not f.is_file():
        raise ContractError(str(trust.step_dir(directory, step)), None,
                            f"has no {f.name}: it was written by another dp × pp split")
    state: dict[str, Any] = torch.load(f, map_location="cpu", weights_only=True)
    return state


def saved_partition(state: dict[str, Any]) -> list[int] | None:
    """The partition a checkpoint was taken with (None: written before online repartition existed)."""
    part = state.get("partition")
    return None if part is None else [int(n) for n in part]


def load(state: dict[str, Any], module: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load a checkpoint read by :func:`read` into ``module`` and ``optimizer``; returns the next subnet id."""
    module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optim"])  # torch puts each state tensor on its parameter's device
    return int(state["next_subnet"])


__all__ = ["load", "read", "save", "saved_partition"]
