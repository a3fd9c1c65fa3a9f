"""Checkpoint and resume with torch.distributed.checkpoint (DCP).

Every rank saves its model parts (one per virtual stage) and their optimizers through DCP's
state-dict helpers, torchtitan-style: parameter names are the unsplit model's, optimizer state is
flattened by parameter name (``StateDictOptions(flatten_optimizer_state_dict=True)``), so the
parts of all pipeline ranks merge into one namespace and DCP can reshard on load (another
``dp``/``pp`` split of the same model resumes). Sharded DTensors (FSDP2, TP) are written shard by
shard. A step's checkpoint lives in ``DIR/step-<N>``; after all ranks finished writing, rank 0
writes the step's manifest (size and sha256 of every file, the model and TP degree it was
written for) and records the step in ``DIR/latest.json`` (the newest step and every complete one),
so an interrupted save is never picked up. Resume loads the newest, or a chosen complete step.
Run state that is not a tensor (the gradient noise scale's moving averages, which a resumed run
continues) is a small JSON document, ``run_state.json``, written by rank 0 into the step before
its manifest, so the same sha256 check covers it; it is read back as JSON, never unpickled.

A checkpoint is code (DCP's reader unpickles ``.metadata``), so :func:`load` runs every check of
:mod:`mindpipe.executor.checkpoint_trust` — ownership, permissions, manifest, model, TP — before
torch reads a byte of it. A step's manifest keeps ``tp`` because the fused QKV weight is stored in the
head-major order of that TP degree (:func:`mindpipe.executor.stages.head_major_qkv`), so resuming
with another ``tp`` is refused.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from mindpipe.executor import checkpoint_trust as trust
from mindpipe.traces.atomic import write_text
from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import read_json
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

_OPTS = StateDictOptions(flatten_optimizer_state_dict=True)
_TABLE, _HEAD = "embedding.tok.weight", "lm_head.out.weight"  # a tied head's two names of the token table
LATEST = trust.LATEST
RUN_STATE = "run_state.json"


def _state(parts: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer]) -> dict[str, Any]:
    model: dict[str, Any] = {}
    optim: dict[str, Any] = {}
    for part, opt in zip(parts, optimizers, strict=True):
        model.update(get_model_state_dict(part))
        optim.update(get_optimizer_state_dict(part, opt, options=_OPTS))
    if _HEAD in model and not any(_HEAD in k for k in optim):
        # A stage holding a tied head's one table: torch names its optimizer state once, under the
        # table. Name it under the head too, so that a plan whose last stage holds a copy of the
        # table (mindpipe.traces.layout.tied_table_ranks) resumes from it, and the reverse.
        # (Loading gives torch the state without these names: _own_optim.)
        optim.update({k.replace(_TABLE, _HEAD): v for k, v in list(optim.items()) if _TABLE in k})
    return {"model": model, "optim": optim}


def _own_optim(part: nn.Module, opt: torch.optim.Optimizer, optim: dict[str, Any]) -> dict[str, Any]:
    """The flattened optimizer state of ``part`` alone, under the names torch gives it."""
    return {k: optim[k] for k in get_optimizer_state_dict(part, opt, options=_OPTS)}


def save(directory: str | Path, step: int, parts: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer],
         tp: int, model: dict[str, Any], run_state: dict[str, Any] | None = None, keep: int = 0) -> Path:
    """Write the checkpoint of global step ``step`` (collective: every rank calls it).

    Args:
        directory: The checkpoint directory (created private if missing; refused if others may write it).
        step: The global step just finished.
        parts, optimizers: This rank's model parts and their optimizers.
        tp: The plan's TP degree (recorded: resuming needs the same).
        model: The model as a JSON document (recorded: resuming needs the same).
        run_state: JSON-able state besides the tensors, the same on every rank (rank 0's is written).
        keep: Keep only this many complete steps, this one and the highest others (0: all).
    """
    root = Path(directory)
    path = trust.step_dir(root, step)
    if dist.get_rank() == 0:
        trust.begin_save(root, step)  # a step written again leaves the record, unverifiable until its new manifest
    dist.barrier()
    dcp.save(_state(parts, optimizers), checkpoint_id=str(path))
    dist.barrier()
    if dist.get_rank() == 0:
        if run_state is not None:
            write_text(path / RUN_STATE, json.dumps(run_state) + "\n")
        trust.finish_save(root, step, model, tp, keep)
    dist.barrier()
    return path


def latest(directory: str | Path) -> dict[str, Any]:
    """The record of the newest complete checkpoint (``latest.json``, after the trust checks).

    Raises:
        ContractError: no complete checkpoint in ``directory``, or one that may not be trusted.
    """
    return trust.read_record(directory).to_json()


def load(directory: str | Path, parts: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer], tp: int,
         model: dict[str, Any], step: int | None = None) -> int:
    """Load the newest checkpoint (or that of ``step``) into ``parts`` and ``optimizers``; returns its step.

    Every check of :func:`mindpipe.executor.checkpoint_trust.check_resume` runs first; torch's
    reader (which unpickles) is reached only for a checkpoint that passed them.

    Raises:
        ContractError: no checkpoint, an untrusted or tampered one, one of another model or TP
            degree, no complete one for ``step``, or one DCP cannot load into this model.
    """
    step = trust.check_resume(directory, model, tp, step)
    state = _state(parts, optimizers)
    try:
        dcp.load(state, checkpoint_id=str(trust.step_dir(directory, step)))
        for part, opt in zip(parts, optimizers, strict=True):
            mine = {k: state["model"][k] for k in get_model_state_dict(part)}
            set_model_state_dict(part, mine)
            set_optimizer_state_dict(part, opt, _own_optim(part, opt, state["optim"]), options=_OPTS)
    except (RuntimeError, ValueError, KeyError, OSError, CheckpointException) as e:
        # DCP's CheckpointException (a BaseException) carries each failed rank's own exception, as
        # (exception, traceback) pairs from its collectives.
        cause: BaseException = e
        if isinstance(e, CheckpointException) and e.failures:
            first_failure = next(iter(e.failures.values()))
            cause = first_failure[0] if isinstance(first_failure, tuple) else first_failure
        first = next((ln.strip() for ln in str(cause).splitlines() if ln.strip()), type(cause).__name__)
        raise ContractError(str(trust.step_dir(directory, step)), None,
                            f"cannot load this checkpoint into the run's model: {first[:300]}") from e
    return step


def run_state(directory: str | Path, step: int) -> dict[str, Any] | None:
    """The ``run_state.json`` of a step that :func:`load` has loaded (None: the step has none).

    Call it only after :func:`load`: the manifest check has then covered the file.

    Raises:
        ContractError: the file is not a JSON object.
    """
    path = trust.step_dir(directory, step) / RUN_STATE
    if not path.is_file():
        return None
    doc = read_json(path)
    if not isinstance(doc, dict):
        raise ContractError(str(path), None, "run state must be a JSON object")
    return doc


__all__ = ["RUN_STATE", "latest", "load", "run_state", "save"]
