"""Column-parallel linears under sequence parallelism that keep only this rank's sequence shard.

Under sequence parallelism (Korthikanti et al. 2022, §4.2.2) the input of the attention's and the
MLP's first GEMMs is all-gathered along the sequence. torch's ``ColwiseParallel`` then lets the
GEMM save that gathered ``[b, s, h]`` input for its weight gradient, t times what Megatron keeps:
Megatron's ``LinearWithGradAccumulationAndAsyncCommunication`` saves the rank's ``[b, s/t, h]``
shard and all-gathers it again in the backward. The simulator's memory model counts the shard
(:func:`mindpipe.simulator.memory.block_activation_bytes`, Korthikanti's 34·s·b·h/t); with torch's
layout a tp8 run would hold about 80 % more activations than planned.

:func:`keep_sequence_shard` gives a module's column-parallel linears (GPT: ``attn.qkv``,
``mlp.fc1``; Llama: ``attn.wq/wk/wv``, ``mlp.gate/up``; the LM head's ``out``, whose logits stay
vocabulary-parallel, as Megatron's output layer keeps only the shard too) Megatron's behaviour: each saves one clone
of the rank's chunk of the gathered input, shared by the module's linears (Llama's three
projections keep one copy), and the backward all-gathers it once for all of them. The input's
gradient is returned as a partial sum, so the module's ``PrepareModuleInput`` reduce-scatters it
as before. Weights and biases are ``Shard(0)`` DTensors, as ``ColwiseParallel`` makes them, so
checkpoints and the optimizer see the same parameters.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mindpipe.traces.torch_head_loss import gather_sequence
from torch import nn
from torch.autograd.function import once_differentiable
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor


class _Kept:
    """One forward of a module: the rank's shard of its gathered input, made once and saved by
    every linear of the module, and the gathered input the backward rebuilds from it once."""

    def __init__(self, group: Any, consumers: int) -> None:
        self.group, self.consumers = group, consumers
        self.shard: torch.Tensor | None = None
        self.full: torch.Tensor | None = None
        self.used = 0

    def shard_of(self, x: torch.Tensor) -> torch.Tensor:
        if self.shard is None:
            t, r = dist.get_world_size(self.group), dist.get_rank(self.group)
            self.shard = x.detach().tensor_split(t, dim=1)[r].clone()
        return self.shard

    def gathered(self, shard: torch.Tensor) -> torch.Tensor:
        """The whole input, all-gathered from the shards; released after the last linear's backward."""
        full = self.full
        if full is None:
            full = gather_sequence(shard, self.group)
        self.used += 1
        self.full = None if self.used >= self.consumers else full
        return full


class _ShardSavedLinear(torch.autograd.Function):
    """``F.linear(x, weight, bias)`` that saves ``kept``'s shard of ``x`` instead of ``x``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, kept: _Kept) -> torch.Tensor:
        ctx.save_for_backward(kept.shard_of(x), weight)
        ctx.kept, ctx.has_bias = kept, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, None]:
        shard, weight = ctx.saved_tensors
        full = ctx.kept.gathered(shard)
        g2 = grad.reshape(-1, grad.shape[-1])
        grad_w = g2.t().mm(full.reshape(-1, full.shape[-1]))
        grad_b = g2.sum(dim=0) if ctx.has_bias else None
        return grad.matmul(weight), grad_w, grad_b, None


def _forward(linear: nn.Linear, owner: nn.Module, x: torch.Tensor) -> torch.Tensor:
    # x: the module's all-gathered input, a Replicate DTensor; its gradient from this rank's
    # columns is a partial sum (reduce-scattered by the module's PrepareModuleInput backward).
    local = x.to_local(grad_placements=[Partial()]) if isinstance(x, DTensor) else x
    # The weight and bias are Shard(0) DTensors (keep_sequence_shard); torch types them as plain tensors.
    bias = cast(DTensor, linear.bias).to_local() if linear.bias is not None else None
    out: torch.Tensor = _ShardSavedLinear.apply(local, cast(DTensor, linear.weight).to_local(), bias,
                                                owner._sp_kept)  # type: ignore[union-attr]
    return out


def keep_sequence_shard(owner: nn.Module, names: list[str], tp_mesh: DeviceMesh) -> bool:
    """Make ``owner``'s linears ``names`` column-parallel over ``tp_mesh`` with Megatron's saved
    shard (module docstring). Returns False, changing nothing, when one of them is not a plain
    ``nn.Linear`` (e.g. torchao's ``Float8Linear``: its GEMM stays torch's ``ColwiseParallel``)."""
    modules = [owner.get_submodule(n) for n in names]
    if not modules or any(type(m) is not nn.Linear for m in modules):
        return False
    linears = cast(list[nn.Linear], modules)
    group = tp_mesh.get_group()
    for m in linears:
        m.weight = nn.Parameter(distribute_tensor(m.weight.data, tp_mesh, [Shard(0)]))
        if m.bias is not None:
            m.bias = nn.Parameter(distribute_tensor(m.bias.data, tp_mesh, [Shard(0)]))
        m.forward = functools.partial(_forward, m, owner)  # type: ignore[method-assign]

    def fresh(module: nn.Module, args: Any) -> None:  # one _Kept per forward (and per recompute)
        module._sp_kept = _Kept(group, len(linears))  # type: ignore[assignment]

    owner.register_forward_pre_hook(fresh)
    return True


__all__ = ["keep_sequence_shard"]
