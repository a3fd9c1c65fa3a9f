"""Checkpoint and resume with torch.distributed.checkpoint (DCP).

Every rank saves its model parts (one per virtual stage) and their optimizers through DCP's
state-dict helpers, torchtitan-style: parameter names are the unsplit model's, optimizer state is
flattened by parameter name (``StateDictOptions(flatten_optimizer_state_dict=True)``), so the
parts of all pipeline ranks merge into one namespace and DCP can reshard on load (another
``dp``/``pp`` split of the same model resumes). Sharded DTensors (FSDP2, TP) are written shard by
shard. A step's checkpoint lives in ``DIR/step-<N>``; after all ranks finished writing, rank 0
records it in ``DIR/latest.json`` (the newest step and every complete one), so an interrupted
save is never picked up. Resume loads the newest, or a chosen complete step.

``latest.json`` also keeps ``tp``: the fused QKV weight is stored in the head-major order of
that TP degree (:func:`mindpipe.executor.stages.head_major_qkv`), so resuming with another ``tp`` is
refused.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from mindpipe.traces.errors import ContractError
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

_OPTS = StateDictOptions(flatten_optimizer_state_dict=True)
LATEST = "latest.json"


def _state(parts: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer]) -> dict[str, Any]:
    model: dict[str, Any] = {}
    optim: dict[str, Any] = {}
    for part, opt in zip(parts, optimizers, strict=True):
        model.update(get_model_state_dict(part))
        optim.update(get_optimizer_state_dict(part, opt, options=_OPTS))
    return {"model": model, "optim": optim}


def save(directory: str | Path, step: int, parts: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer],
         tp: int) -> Path:
    """Write the checkpoint of global step ``step`` (collective: every rank calls it)."""
    root = Path(directory)
    path = root / f"step-{step}"
    dcp.save(_state(parts, optimizers), checkpoint_id=str(path))
    dist.barrier()
    if dist.get_rank() == 0:
        done = sorted(set(_complete(root)) | {step})
        tmp = root / (LATEST + ".tmp")
        tmp.write_text(json.dumps({"step": step, "tp": tp, "complete": done}) + "\n", encoding="utf-8")
        tmp.replace(root / LATEST)
    dist.barrier()
    return path


def _complete(root: Path) -> list[int]:
    p = root / LATEST
    return [int(s) for s in json.loads(p.read_text(encoding="utf-8")).get("complete", [])] if p.is_file() else []


def latest(directory: str | Path) -> dict[str, Any]:
    """The record of the newest complete checkpoint.

    Raises:
        ContractError: no complete checkpoint in ``directory``.
    """
    p = Path(directory) / LATEST
    if not p.is_file():
        raise ContractError(str(directory), None, "no checkpoint to resume from (latest.json missing)")
    return dict(json.loads(p.read_text(encoding="utf-8")))


def load(directory: str | Path, parts: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer], tp: int,
         step: int | None = None) -> int:
    """Load the newest checkpoint (or that of ``step``) into ``parts`` and ``optimizers``; returns its step.

    Raises:
        ContractError: no checkpoint, no complete one for ``step``, or one written with another TP degree.
    """
    info = latest(directory)
    if int(info["tp"]) != tp:
        raise ContractError(str(directory), "tp", f"checkpoint was written with tp={info['tp']}, this plan has tp={tp}")
    step = int(info["step"]) if step is None else step
    if step not in info.get("complete", []):
        raise ContractError(str(directory), "step", f"no complete checkpoint of step {step} (complete: {info.get('complete')})")
    state = _state(parts, optimizers)
    dcp.load(state, checkpoint_id=str(Path(directory) / f"step-{step}"))
    for part, opt in zip(parts, optimizers, strict=True):
        mine = {k: state["model"][k] for k in get_model_state_dict(part)}
        set_model_state_dict(part, mine)
        set_optimizer_state_dict(part, opt, state["optim"], options=_OPTS)
    return step


__all__ = ["latest", "load", "save"]
