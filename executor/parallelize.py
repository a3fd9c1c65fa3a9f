"""Apply the plan's tensor, recompute and data parallelism to one stage module.

Order as torchtitan's ``parallelize_llama``: tensor parallelism (DTensor) → activation
checkpointing → data parallelism (FSDP2 ``fully_shard`` for ``zero_stage`` ≥ 1, FSDP2-style
``replicate`` for ``zero_stage`` 0), with ``reshard_after_forward = not pp_enabled``.

Tensor parallelism is Megatron's layout (Shoeybi et al. 2019): the token table row-parallel over
the vocabulary, QKV and fc1 column-parallel, projection and fc2 row-parallel (Llama: Q, K, V, gate
and up column-parallel, output projection and down row-parallel; K/V heads split over tp), the LM
head column-parallel over the vocabulary with its logits left vocabulary-parallel: each rank's loss
is Megatron's vocabulary-parallel cross-entropy over its columns
(:class:`mindpipe.traces.torch_gpt.VocabShard`), so no rank holds the whole ``[s, b, V]`` logits
(the simulator's memory model divides them by t: :func:`mindpipe.simulator.memory.logit_count`).
With sequence parallelism (Korthikanti et al. 2022, §4.2.2) LayerNorms and the residual
stream are split along the sequence (``Shard(1)``); the attention and MLP inputs are all-gathered
and the row-parallel outputs reduce-scattered, as in torchtitan's plan; the GEMMs after the
all-gather save only the rank's sequence shard of their input and gather it again in the backward,
as Megatron does (:mod:`mindpipe.executor.sp_linear`).

Recompute wraps a block's ``forward`` (instance attribute, so parameter names stay unchanged):
``full`` checkpoints the whole block; ``selective`` checkpoints only the attention core (Q·Kᵀ,
mask, softmax, dropout, ·V: ``Attention.core``), as Korthikanti et al. (2022, §5) define it and
Megatron implements it — the simulator's compute and memory models price exactly that; ``nongemm``
runs the block under torch's selective activation checkpointing, keeping its GEMM outputs and
re-running every other operator (:func:`nongemm_policy`); ``swap``
(per-layer policy) sends the block's saved activations to a host pool
(:mod:`mindpipe.executor.offload`: pinned memory and a side stream on CUDA, a separately counted
pool on CPU).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
from mindpipe.executor.distributed import replica_mesh
from mindpipe.executor.memory_account import MemoryAccount
from mindpipe.executor.offload import HostPool, swapping
from mindpipe.executor.sp_linear import keep_sequence_shard
from mindpipe.executor.stages import StageModule
from mindpipe.traces.config import Plan
from mindpipe.traces.layout import (
    BlockPolicy,
    block_policies,
    data_parallel_units,
    reduces_every_microbatch,
    reshards_after_forward,
)
from mindpipe.traces.torch_gpt import VocabShard, vocab_parallel_embedding
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Placement, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
    noop_context_fn,
)


def apply_tensor_parallel(stage: StageModule, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Shard the stage's blocks and head over ``tp_mesh`` (see module docstring)."""
    sp = sequence_parallel
    residual = Shard(1) if sp else Replicate()
    # One stage holding a tied head's one table (mindpipe.traces.layout.tied_table_ranks): both
    # sides shard it Shard(0) over the vocabulary, so the head is tied again to the sharded table.
    tied = stage.embedding is not None and stage.lm_head is not None \
        and stage.lm_head.out.weight is stage.embedding.tok.weight
    for block in stage.blocks.values():
        _shard_block(block, tp_mesh, residual, sp)
    _shard_embedding(stage, tp_mesh, sp)
    _shard_head(stage, tp_mesh, residual, sp, tied)


def _block_layout(residual: Placement, sp: bool) -> dict[str, ParallelStyle]:
    """The tensor-parallel style of every submodule a GPT or Llama block may hold (``residual``: the
    row-parallel outputs' layout, ``Shard(1)`` under sequence parallelism)."""
    layout: dict[str, ParallelStyle] = {
        "attn.qkv": ColwiseParallel(),
        "attn.proj": RowwiseParallel(output_layouts=residual),
        "mlp.fc1": ColwiseParallel(),
        "mlp.fc2": RowwiseParallel(output_layouts=residual),
        # Llama (traces/torch_llama.py): Q, K, V column-parallel by whole heads (tp divides
        # num_kv_heads, check_plan), so rank r holds query heads r·a/t.. and the K/V heads they
        # use; SwiGLU's gate and up column-parallel, down row-parallel.
        "attn.wq": ColwiseParallel(),
        "attn.wk": ColwiseParallel(),
        "attn.wv": ColwiseParallel(),
        "mlp.gate": ColwiseParallel(),
        "mlp.up": ColwiseParallel(),
        "mlp.down": RowwiseParallel(output_layouts=residual),
    }
    if sp:
        layout.update({
            "ln1": SequenceParallel(),
            "ln2": SequenceParallel(),
            "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        })
    return layout


def _shard_block(block: nn.Module, tp_mesh: DeviceMesh, residual: Placement, sp: bool) -> None:
    """Apply :func:`_block_layout` to the submodules ``block`` holds, over ``tp_mesh``."""
    layout = _block_layout(residual, sp)
    # A block cut by a stage boundary holds only its attention or its MLP half (executor/stages.py).
    held = {name for name, _ in block.named_modules()}
    if sp:  # the gathered input's first GEMMs keep only this rank's shard of it (executor/sp_linear.py)
        for part, names in (("attn", ("qkv", "wq", "wk", "wv")), ("mlp", ("fc1", "gate", "up"))):
            mine = [n for n in names if f"{part}.{n}" in held]
            if part in held and keep_sequence_shard(block.get_submodule(part), mine, tp_mesh):
                held -= {f"{part}.{n}" for n in mine}
    parallelize_module(block, tp_mesh, {k: v for k, v in layout.items() if k in held})


def _shard_embedding(stage: StageModule, tp_mesh: DeviceMesh, sp: bool) -> None:
    """Make the first stage's token table vocabulary-parallel over ``tp_mesh`` (no-op on other stages)."""
    if stage.embedding is not None:
        # Megatron's vocabulary-parallel token table (vocab_parallel_embedding): each rank looks
        # up the tokens of its rows, zeros elsewhere, and the partial outputs are all-reduced.
        # GPT's position table stays replicated (s·h). With sequence parallelism the embedding's
        # output is then cut along the sequence (no communication).
        tok: Any = stage.embedding.tok
        tok.weight = nn.Parameter(distribute_tensor(tok.weight.data, tp_mesh, [Shard(0)]))
        tok.forward = functools.partial(vocab_parallel_embedding, tok, _vocab_shard(tok.weight, tp_mesh))
        if sp:
            parallelize_module(stage.embedding, tp_mesh, PrepareModuleOutput(
                output_layouts=Replicate(), desired_output_layouts=Shard(1), use_local_output=True))


def _shard_head(stage: StageModule, tp_mesh: DeviceMesh, residual: Placement, sp: bool, tied: bool) -> None:
    """Make the last stage's LM head vocabulary-parallel over ``tp_mesh`` (no-op on other stages);
    ``tied``: tie it again to the stage's sharded token table."""
    if stage.lm_head is not None and stage.final_norm is not None:
        if sp:
            parallelize_module(stage.final_norm, tp_mesh, SequenceParallel())
        if stage.fused_head:
            # fused_head_loss: the loss runs the head's GEMM over its rows itself, vocabulary-parallel
            # (mindpipe.traces.torch_head_loss), on the final norm's output (a sequence shard under SP).
            out: Any = stage.lm_head.out
            out.weight = nn.Parameter(distribute_tensor(out.weight.data, tp_mesh, [Shard(0)]))
            stage.lm_head.shard = _vocab_shard(out.weight, tp_mesh)
            stage.lm_head.sequence_parallel = sp
            return
        if sp and keep_sequence_shard(stage.lm_head, ["out"], tp_mesh):
            # Megatron's output layer under sequence parallelism: the head's GEMM saves this rank's
            # sequence shard of its gathered input and gathers it again for the weight gradient
            # (executor/sp_linear.py), as the blocks' first GEMMs do; its logits stay vocabulary-parallel.
            parallelize_module(stage.lm_head, tp_mesh, PrepareModuleInput(input_layouts=(Shard(1),),
                                                                          desired_input_layouts=(Replicate(),)))
        else:
            parallelize_module(stage.lm_head, tp_mesh, {
                "out": ColwiseParallel(input_layouts=residual, output_layouts=Shard(-1), use_local_output=True)})
        if tied and stage.embedding is not None:
            stage.lm_head.out.weight = stage.embedding.tok.weight
        _vocab_shard(stage.lm_head.out.weight, tp_mesh)


def _vocab_shard(weight: Any, tp_mesh: DeviceMesh) -> VocabShard:
    """The :class:`VocabShard` of a ``Shard(0)`` vocabulary table, checked against the rows torch gave it."""
    rows, shard = weight.to_local().shape[0], VocabShard.of(weight.shape[0], tp_mesh.get_group())
    if rows != shard.width:  # VocabShard's split rule is no longer torch's Shard(0): lookups and the loss would be wrong
        raise RuntimeError(f"a vocabulary shard holds {rows} rows, VocabShard.of expects {shard.width}")
    return shard


def _checkpointed(forward: Callable[..., Any], memory: MemoryAccount | None) -> Callable[..., Any]:
    contexts = memory.recompute_contexts if memory is not None else noop_context_fn

    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True, context_fn=contexts, **kwargs)

    return run


def nongemm_policy(ffn_width: int, keep_last: bool) -> Callable[..., CheckpointPolicy]:
    """Which operators a ``nongemm`` block keeps (:mod:`mindpipe.traces.layout`): the outputs of its
    GEMMs (``aten.addmm``/``aten.mm``: QKV, projection, fc1; SwiGLU's gate and up), and of the GEMM
    whose input is the ``ffn_width``-wide MLP activation (fc2, down) only when ``keep_last`` (with
    dropout, its output is what the MLP-dropout mask is re-drawn from). Everything else is
    re-run; the attention core's batched matmuls are part of the core and re-run with it."""
    aten = torch.ops.aten

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        x = args[1] if func is aten.addmm.default else args[0] if func is aten.mm.default else None
        if x is not None and (keep_last or x.shape[-1] != ffn_width):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _nongemm(forward: Callable[..., Any], policy: Callable[..., CheckpointPolicy],
             memory: MemoryAccount | None) -> Callable[..., Any]:
    """``forward`` under torch's selective activation checkpointing with ``policy``; ``memory``
    counts the cached outputs as activations and the re-run ones as transient."""

    def contexts() -> tuple[Any, Any]:
        if memory is None:
            return create_selective_checkpoint_contexts(policy)
        fwd, rec = create_selective_checkpoint_contexts(policy)
        # Below the caching mode (entered first), a mode that sees each operator the cache runs and
        # counts the outputs the policy keeps (torch's policy context carries the output only from
        # torch 2.12 on); the accounting's mode below the recompute's cache, so that outputs the
        # cache hands back never reach it.
        return _Stacked(_KeptOutputs(policy, memory, rec), fwd), _Stacked(memory.recompute_contexts()[1], rec)

    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True, context_fn=contexts, **kwargs)

    return run


class _KeptOutputs(TorchDispatchMode):
    """Counts, in a selectively checkpointed forward, the outputs ``policy`` keeps as activations
    held until ``owner`` (the checkpoint's recompute context) is freed."""

    def __init__(self, policy: Callable[..., CheckpointPolicy], memory: MemoryAccount, owner: object) -> None:
        super().__init__()
        self.policy, self.memory, self.owner = policy, memory, owner

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and self.policy(None, func, *args, **kwargs) == CheckpointPolicy.MUST_SAVE:
            self.memory.cached(out, self.owner)
        return out


class _Stacked:
    """Enters context managers in order, exits them in reverse (the last entered is on top)."""

    def __init__(self, *managers: Any) -> None:
        self.managers, self.stack = managers, contextlib.ExitStack()

    def __enter__(self) -> None:
        for m in self.managers:
            self.stack.enter_context(m)

    def __exit__(self, *exc: Any) -> Any:
        return self.stack.__exit__(*exc)


def _swapped(forward: Callable[..., Any], pool: HostPool, memory: MemoryAccount | None) -> Callable[..., Any]:
    on_unpack = memory.transient if memory is not None else None

    def run(*args: Any, **kwargs: Any) -> Any:
        with swapping(pool, on_unpack):
            return forward(*args, **kwargs)

    return run


def apply_recompute(stage: StageModule, policies: list[BlockPolicy], pool: HostPool | None = None,
                    memory: MemoryAccount | None = None) -> None:
    """Wrap each block's forward per its policy (indices are global block numbers).

    ``pool`` receives the saved activations of ``swap`` blocks (a new one on the stage's device
    when None); ``memory``, the rank's accounting, counts recomputed outputs and swapped-in copies
    as transient.
    """
    for key, block in stage.blocks.items():
        policy = policies[int(key)]
        if policy == "full":
            block.forward = _checkpointed(block.forward, memory)  # type: ignore[method-assign]
        elif policy == "selective":
            attn: Any = block.attn
            attn.core = _checkpointed(attn.core, memory)
        elif policy == "nongemm":
            mlp: Any = block.mlp  # GPT's fc1 or Llama's up is ffn wide (tp = 1: check_plan)
            width = (mlp.fc1 if hasattr(mlp, "fc1") else mlp.up).out_features
            rule = nongemm_policy(width, keep_last=bool(getattr(mlp, "dropout", 0.0)))
            block.forward = _nongemm(block.forward, rule, memory)  # type: ignore[method-assign]
        elif policy == "swap":
            if pool is None:
                pool = HostPool(next(block.parameters()).device)
            block.forward = _swapped(block.forward, pool, memory)  # type: ignore[method-assign]


def apply_data_parallel(stage: StageModule, dp_mesh: DeviceMesh, plan: Plan) -> nn.Module:
    """FSDP2 (``zero_stage`` ≥ 1: per block, then the stage) or replication (``zero_stage`` 0) over
    ``dp_mesh``, the gradient replicas (dp·cp ranks under context parallelism: ``replica_mesh``).

    bf16 (and fp8, whose non-GEMM work is bf16: :mod:`mindpipe.executor.fp8`) keeps fp32 master weights and
    reduces gradients in fp32 (MixedPrecisionPolicy). With
    one data-parallel rank and fp32 there is nothing to do, and no wrapper is applied (its hooks
    would only cost time). Whether ZeRO-3 frees gathered weights after the forward is the plan rule
    :func:`mindpipe.traces.layout.reshards_after_forward` (the simulator prices the same gathers).
    """
    zero_stage, precision = plan.zero_stage, plan.precision
    if data_parallel_units(plan, len(stage.blocks)) == 0:
        return stage
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if precision in ("bf16", "fp8") \
        else MixedPrecisionPolicy()
    if zero_stage == 0:
        replicate(stage, mesh=dp_mesh, mp_policy=mp)
        return stage
    reshard = reshards_after_forward(plan)
    for block in stage.blocks.values():
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(stage, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
    if reduces_every_microbatch(plan):
        _keep_gradient_sync(stage)
    return stage


def _keep_gradient_sync(stage: nn.Module) -> None:
    """Keep FSDP2's reduce-scatter in every backward (:func:`mindpipe.traces.layout.reduces_every_microbatch`).

    torch's pipelining runtime, which also runs a single stage, turns gradient sync and
    resharding after backward off (recursively) before each backward and on again for one final
    reduction; shadowing those setters on the stage leaves FSDP2's defaults: each micro-batch's
    gradients are reduce-scattered as its backward produces them and accumulate in the shards.
    """
    for name in ("set_requires_gradient_sync", "set_reshard_after_backward", "set_is_last_backward"):
        setattr(stage, name, lambda *args, **kwargs: None)


def parallelize_stage(stage: StageModule, mesh: DeviceMesh, plan: Plan, num_layers: int, pool: HostPool | None = None,
                      memory: MemoryAccount | None = None) -> nn.Module:
    """TP → recompute → DP on one stage module (in place); returns the module to run.

    ``pool`` and ``memory``: see :func:`apply_recompute`.
    """
    if plan.tp > 1:
        apply_tensor_parallel(stage, mesh["tp"], plan.sequence_parallel)
    apply_recompute(stage, block_policies(plan, num_layers), pool, memory)
    return apply_data_parallel(stage, replica_mesh(mesh), plan)


__all__ = ["apply_data_parallel", "apply_recompute", "apply_tensor_parallel", "parallelize_stage"]
