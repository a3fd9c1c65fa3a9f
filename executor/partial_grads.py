"""Gradients left as partial sums by tensor parallelism, reduced in one message.

Under sequence parallelism the norms (GPT's LayerNorms, Llama's RMSNorms: ``SequenceParallel``
in :mod:`mindpipe.executor.parallelize`) hold replicated weights but see only the rank's part of
the sequence, so each rank's gradient of them is a partial sum over the tensor-parallel group:
DTensor keeps it ``Partial`` through every micro-batch's backward. Left so, AdamW's first
operation on each of them redistributes it: one all-reduce per parameter (4 per GPT block).
Megatron-LM reduces them once per iteration, after the pipeline's last backward and the
data-parallel reduction and before the step, in one flattened all-reduce over the
tensor-parallel group (``finalize_model_grads`` → ``_allreduce_layernorm_grads``);
:func:`reduce_partial_grads` does the same, and the simulator prices it so
(:func:`mindpipe.simulator.costs.partial_grad_params`). The executor runs it as each pipeline
stage's gradient reduction begins (:func:`reduce_before_grad_sync`), before FSDP2's, which would
otherwise redistribute the partial gradients one by one, and again after the schedule for a
schedule that skips that reduction (nothing is left to do otherwise). Not covered: ZeRO-2/3
without pipelining, whose FSDP2 reduction runs in every backward
(:func:`mindpipe.traces.layout.reduces_every_microbatch`) and still redistributes them one by one.

:func:`reduced_partials` is the one place that turns partial DTensors into reduced ones; the noise
probe (:mod:`mindpipe.executor.noise_probe`) reads norms through it without writing gradients.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from mindpipe.executor.memory_account import all_fsdp_params
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Partial, Replicate


def is_partial(t: torch.Tensor) -> bool:
    """``t`` is a DTensor holding a pending sum over some mesh dimension."""
    return isinstance(t, DTensor) and any(p.is_partial() for p in t.placements)


def reduced_partials(tensors: list[DTensor]) -> list[DTensor]:
    """``tensors`` (partial DTensors) with their pending sums done: ``Replicate`` where they were
    ``Partial``, other placements kept. Tensors of one mesh, placements and dtype go in one
    all-reduce per partial mesh dimension (their local parts flattened into one buffer); a partial
    that is not a sum (``avg``, ``max``, ...) is redistributed on its own."""
    out: list[DTensor | None] = [None] * len(tensors)
    groups: dict[tuple[int, tuple[object, ...], torch.dtype], list[int]] = {}
    for k, t in enumerate(tensors):
        if all(not p.is_partial() or (isinstance(p, Partial) and p.reduce_op == "sum") for p in t.placements):
            groups.setdefault((id(t.device_mesh), tuple(t.placements), t.dtype), []).append(k)
        else:
            out[k] = t.redistribute(t.device_mesh, [Replicate() if p.is_partial() else p for p in t.placements])
    for members in groups.values():
        first = tensors[members[0]]
        mesh, placements = first.device_mesh, first.placements
        locals_ = [tensors[k].to_local() for k in members]
        flat = torch.cat([x.reshape(-1) for x in locals_])
        for dim, p in enumerate(placements):
            if p.is_partial():
                dist.all_reduce(flat, group=mesh.get_group(dim))
        done = tuple(Replicate() if p.is_partial() else p for p in placements)
        offset = 0
        for k, local in zip(members, locals_, strict=True):
            t, n = tensors[k], local.numel()
            out[k] = DTensor.from_local(flat[offset:offset + n].view_as(local), mesh, done, run_check=False,
                                        shape=t.shape, stride=t.stride())
            offset += n
    return [t for t in out if t is not None]


def _grad_slots(module: nn.Module) -> list[tuple[object, str]]:
    """Where ``module``'s gradients are held now, as (holder, attribute): each parameter's ``grad``,
    or under FSDP2 before its reduction each ``FSDPParam``'s unsharded gradient and the sum it
    accumulates over micro-batches (``unsharded_accumulated_grad``)."""
    out: list[tuple[object, str]] = [(p, "grad") for p in module.parameters()]
    if isinstance(module, FSDPModule):
        for fp in all_fsdp_params(module):
            if hasattr(fp, "_unsharded_param"):
                out += [(fp._unsharded_param, "grad"), (fp, "unsharded_accumulated_grad")]
    return out


def reduce_partial_grads(modules: Iterable[nn.Module]) -> int:
    """Replace every gradient of ``modules`` that is still a partial sum by its reduced value
    (:func:`reduced_partials`: one all-reduce per group of like gradients). Under FSDP2 that
    includes the unsharded gradients its reduction has not taken yet, which it would otherwise
    redistribute one by one. Returns how many gradients were reduced (0: no collective issued)."""
    slots = [(obj, attr) for mod in modules for obj, attr in _grad_slots(mod)
             if is_partial(getattr(obj, attr, None))]  # type: ignore[arg-type]
    if not slots:
        return 0
    for (obj, attr), g in zip(slots, reduced_partials([getattr(obj, attr) for obj, attr in slots]), strict=True):
        setattr(obj, attr, g)
    return len(slots)


def reduce_before_grad_sync(stage: object, module: nn.Module) -> None:
    """Reduce ``module``'s partial gradients (:func:`reduce_partial_grads`) as the pipeline stage's
    gradient reduction (``perform_reduce_grad``: after its last backward of the step) begins,
    before the data-parallel reduction and whatever else wraps it reads them (install it last)."""
    red = stage.perform_reduce_grad  # type: ignore[attr-defined]

    def perform_reduce_grad(grad_scale_factor: int) -> None:
        reduce_partial_grads([module])
        red(grad_scale_factor)

    stage.perform_reduce_grad = perform_reduce_grad  # type: ignore[attr-defined]


__all__ = ["is_partial", "reduce_before_grad_sync", "reduce_partial_grads", "reduced_partials"]
