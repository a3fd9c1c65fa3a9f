"""Take the two gradient norms the noise scale needs during a real step, without changing it.

The estimator (:mod:`mindpipe.traces.noise_scale`) compares the squared norm of a gradient over a
small batch with one over a big batch. Both are read where the executor's step already has them:

* ``data_parallel`` (``dp > 1``): G_small is a replica's local gradient (batch = global / dp),
  read in ``perform_reduce_grad`` *before* the data-parallel reduction — FSDP2 (``fully_shard``
  and its ``replicate``) keeps it unsharded on the parameter group until then
  (``FSDPParam.unsharded_accumulated_grad`` and ``unsharded_param.grad``, private names read
  here only) as the sum over the rank's micro-batches, so its squared norm is divided by m².
  G_big is the reduced gradient (``param.grad`` after ``perform_reduce_grad``: averaged over
  replicas and scaled by 1/m). |G_small|² is averaged over the replicas.
  Where FSDP2 reduce-scatters in every backward (ZeRO-2/3 without pipelining,
  :func:`mindpipe.traces.layout.reduces_every_microbatch`) nothing local is left by then, so each
  parameter group's local gradient is read as its first post-backward of the step begins, before
  its reduce-scatter: the replica's first micro-batch (batch = micro-batch size; with one
  micro-batch per step that is the replica's whole batch, as above).
* ``microbatch`` (one replica, ``m > 1`` micro-batches): G_small is one micro-batch's gradient,
  read right after the stage's first gradient-producing action of the step (B, or W: a weight
  pass), G_big the accumulated step gradient after ``perform_reduce_grad``.

Each stage contributes its parameters' squared norms; the ranks' contributions are summed with
one all-reduce of three scalars over the world at the end of the step. Sharded DTensors (FSDP2
shards, tensor-parallel weights) count each element once; a tensor replicated over k ranks
(Replicate placements; plain tensors on the ``tp`` ranks of a stage; after the reduction, copies
on the ranks outside a DTensor's mesh) counts 1/k per rank. The probe
only reads gradients (it never writes one): the parity tests' losses still match single-process
training, and their first step's norms match the single-process norms (``executor/reference.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from mindpipe.executor.memory_account import all_fsdp_param_groups, all_fsdp_params
from mindpipe.executor.partial_grads import is_partial, reduced_partials
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.layout import reduces_every_microbatch, tied_table_ranks
from mindpipe.traces.noise_scale import GradientNoise, NoiseScaleEstimator, NoiseStepRecord
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor


def noise_method(plan: Plan, model: Model | None = None) -> str | None:
    """``data_parallel``, ``microbatch`` or None (one replica and one micro-batch: nothing to compare;
    or context parallelism, where a rank's gradient is over part of each sequence, not over a batch
    of whole samples, so neither norm is the estimator's small-batch gradient; or a tied head with a
    copy of the token table on the last stage, whose two halves of the table's gradient are summed
    only after the reduction: :func:`mindpipe.traces.layout.tied_table_ranks`)."""
    if plan.cp > 1 or (model is not None and tied_table_ranks(plan, model) is not None):
        return None
    if plan.dp > 1:
        return "data_parallel"
    return "microbatch" if plan.num_microbatches > 1 else None


def _sq(grad: torch.Tensor, holders: int) -> torch.Tensor:
    """This rank's share of ``|grad|²``, each element counted once over the world.

    ``holders``: the ranks of this stage that hold the same value by construction (``tp`` before
    the data-parallel reduction, where replicas differ; ``dp·tp`` after it). A DTensor's own mesh
    says how it is split among its ranks (Shard: disjoint parts; Replicate: copies); the holders
    outside that mesh (e.g. the ``tp`` peers of a parameter FSDP2 shards over ``dp`` only) hold
    copies of it too. ``grad`` holds no pending sum (:func:`squared_norm` reduces those first).
    """
    if isinstance(grad, DTensor):
        copies = holders / grad.device_mesh.size()
        for dim, p in enumerate(grad.placements):
            if p.is_replicate():
                copies *= grad.device_mesh.size(dim)
        return grad.to_local().detach().float().pow(2).sum() / copies
    return grad.detach().float().pow(2).sum() / holders


def _unreduced_grads(module: torch.nn.Module) -> Iterator[torch.Tensor]:
    """The gradients accumulated so far on this rank, before any data-parallel reduction."""
    if not isinstance(module, FSDPModule):
        yield from (p.grad for p in module.parameters() if p.grad is not None)
        return
    yield from _local_grads(all_fsdp_params(module))


def _local_grads(fsdp_params: list[Any]) -> Iterator[torch.Tensor]:
    """The unsharded gradients FSDP2 holds for ``fsdp_params`` before reducing them."""
    for fp in fsdp_params:
        if not hasattr(fp, "_unsharded_param"):
            continue
        acc, grad = fp.unsharded_accumulated_grad, fp._unsharded_param.grad
        if acc is not None and grad is not None:
            yield acc + grad.to(acc.dtype)
        elif acc is not None or grad is not None:
            yield acc if acc is not None else grad


def squared_norm(grads: Iterator[torch.Tensor], holders: int, device: torch.device) -> torch.Tensor:
    """Sum of :func:`_sq` over ``grads`` (a 0-d float32 tensor on ``device``); gradients that are
    still partial sums (sequence parallelism's norms) are reduced first, together
    (:func:`~mindpipe.executor.partial_grads.reduced_partials`: one all-reduce, not one each)."""
    total = torch.zeros((), dtype=torch.float32, device=device)
    pending: list[DTensor] = []
    for g in grads:
        if is_partial(g):
            pending.append(g)  # type: ignore[arg-type]
        else:
            total += _sq(g, holders).to(device)
    for g in reduced_partials(pending) if pending else []:
        total += _sq(g, holders).to(device)
    return total


class NoiseProbe:
    """Per-step gradient norms of one rank's stages, combined into the run's noise scale.

    Args:
        plan: The plan that runs (dp, tp, micro-batches, batch sizes).
        device: This rank's device.
        method: ``data_parallel`` or ``microbatch`` (:func:`noise_method`).
    """

    def __init__(self, plan: Plan, device: torch.device, method: str) -> None:
        self.plan, self.device, self.method = plan, device, method
        # FSDP2 reduces each backward's gradients as it produces them: read them per parameter group
        self.per_group = method == "data_parallel" and reduces_every_microbatch(plan)
        self.small_batch = (plan.global_batch_size // plan.dp if method == "data_parallel" and not self.per_group
                            else plan.micro_batch_size)
        self.big_batch = plan.global_batch_size
        self.estimator = NoiseScaleEstimator(method)
        # small, big, stages reduced; kept on the device so reading a norm never waits for it
        self._acc = torch.zeros(3, dtype=torch.float64, device=device)
        self._seen: set[int] = set()
        self._groups_seen: set[int] = set()

    def wrap_stage(self, stage: Any, module: torch.nn.Module) -> None:
        """Read ``stage``'s gradients around its backward actions and its gradient reduction."""
        s = stage.stage_index
        red = stage.perform_reduce_grad
        tp = self.plan.tp
        m = self.plan.num_microbatches

        def perform_reduce_grad(grad_scale_factor: int) -> None:
            if self.method == "data_parallel" and not self.per_group:
                local = squared_norm(_unreduced_grads(module), tp, self.device)
                self._acc[0] += local.double() / m**2
            red(grad_scale_factor)
            reduced = (p.grad for p in module.parameters() if p.grad is not None)
            self._acc[1] += squared_norm(reduced, self.plan.dp * tp, self.device).double()
            self._acc[2] += 1

        stage.perform_reduce_grad = perform_reduce_grad
        if self.per_group and isinstance(module, FSDPModule):
            for group in all_fsdp_param_groups(module):
                self._read_before_reduce(group)
        if self.method != "microbatch":
            return
        bwd, bww = stage.backward_one_chunk, stage.backward_weight_one_chunk

        def after_first(full: bool) -> None:
            if full and s not in self._seen:
                self._seen.add(s)
                self._acc[0] += squared_norm(_unreduced_grads(module), tp, self.device).double()

        def backward_one_chunk(mb: int, loss: Any = None, full_backward: bool = True, last_backward: bool = False) -> None:
            bwd(mb, loss=loss, full_backward=full_backward, last_backward=last_backward)
            after_first(full_backward)

        def backward_weight_one_chunk(mb: int, last_backward: bool = False) -> None:
            bww(mb, last_backward=last_backward)
            after_first(True)

        stage.backward_one_chunk = backward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk

    def _read_before_reduce(self, group: Any) -> None:
        """Add an FSDP2 parameter group's local gradient to |G_small|² as its first post-backward of
        the step begins (before its reduce-scatter; :attr:`per_group`)."""
        post_backward = group.post_backward

        def read_then_reduce(*args: Any) -> Any:
            if id(group) not in self._groups_seen:
                self._groups_seen.add(id(group))
                self._acc[0] += squared_norm(_local_grads(group.fsdp_params), self.plan.tp, self.device).double()
            return post_backward(*args)

        group.post_backward = read_then_reduce

    def end_step(self, step: int) -> NoiseStepRecord | None:
        """Sum the ranks' norms (a collective: every rank calls it) and update the estimate.

        A step in which some stage's gradients were not reduced through ``perform_reduce_grad``
        (a schedule that bypasses it) is skipped rather than estimated from part of the model.
        """
        acc = self._acc.clone()
        dist.all_reduce(acc)
        small, big, reduced = (float(v) for v in acc.cpu())
        self._acc.zero_()
        self._seen.clear()
        self._groups_seen.clear()
        replicas = self.plan.dp * self.plan.tp  # ranks that run each stage
        if round(reduced) != self.plan.num_stages * replicas:
            return None
        small /= self.plan.dp if self.method == "data_parallel" else 1
        return self.estimator.update(step, small, big, self.small_batch, self.big_batch)

    @property
    def result(self) -> GradientNoise:
        """What the run measured so far."""
        return self.estimator.result


__all__ = ["NoiseProbe", "noise_method", "squared_norm"]
