"""Turn per-layer costs and a plan into the engine's per-stage and per-rank work.

Layers are assigned to virtual stages by the plan's stage layout and every block follows its own
activation policy (:mod:`mindpipe.traces.layout`, the one owner of both rules). Recompute adds the
re-run forward before the input gradient: ``full`` re-runs the block's forward (and its
tensor-parallel collectives — Megatron's checkpointed layers re-issue them), ``selective`` only
the attention core (Korthikanti et al. §5), ``nongemm`` every operator but the GEMMs (the core,
LayerNorms, GeLU, dropouts, residual adds; ``LayerCost.recompute_nongemm_s``); ``swap`` copies the block's activations to the host
after F and back before I over PCIe; ``none`` stores them. Under a split backward (I and W) W
does more on every stage but the first (whose I does nothing and whose W is the whole backward):
torch's non-reentrant checkpoint recomputes in each autograd pass, and W takes one pass per
parameter group, or one pass in all where the executor merges them
(:func:`mindpipe.traces.layout.one_weight_pass`; :func:`weight_pass_extra`).

Gradient reduction: bucket size as Megatron's DDP (max(40M, 1M × dp) parameters), all-reduce
without ZeRO, reduce-scatter with ZeRO ≥ 1 (Megatron's distributed optimizer is ZeRO-1);
gradients travel in fp32 under bf16 (Megatron forces fp32 gradient accumulation for bf16), in
the parameter dtype otherwise.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence

from mindpipe.simulator.costs import (
    DTYPE_BYTES,
    Collective,
    ComputeModel,
    LayerCost,
    layer_params,
    op_layer_costs,
    partial_grad_params,
)
from mindpipe.simulator.engine import RankWork, StageWork
from mindpipe.simulator.ops import Op
from mindpipe.simulator.topology import Phase, Topology
from mindpipe.simulator.work import TpOverlap, swap_chain, swap_out_tail_s, swap_stream_window_s
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.layout import (
    BlockPolicy,
    StageSpan,
    block_policies,
    copies_dp_buffers,
    data_parallel_units,
    gathers_before_forward,
    lazy_copy_back,
    one_weight_pass,
    reduces_every_microbatch,
    reshards_after_forward,
    stage_layout,
    tied_table_ranks,
    weight_groups,
)

GRAD_BYTES = {"fp32": 4, "bf16": 4, "fp16": 2, "fp8": 4}  # fp8: bf16 mixed precision's fp32 main_grad


def bucket_params(plan: Plan) -> int:
    """Parameters per gradient bucket (Megatron DDP default: max(40M, 1M × dp), dp counting the cp ranks)."""
    return max(40_000_000, 1_000_000 * plan.grad_replicas)


def with_tied_copy(costs: list[LayerCost], model: Model, plan: Plan) -> list[LayerCost]:
    """``costs`` with the head's parameters as ``plan`` places them.

    The per-layer costs are cached without the plan's stages, so a tied head owns no parameters
    there; on a stage of its own it holds a copy of the token table
    (:func:`~mindpipe.traces.layout.tied_table_ranks`, its size :func:`~mindpipe.simulator.costs.layer_params`).
    Everything that weighs a stage's parameters (the stage's gradient reduction, PipeDream's
    weight-sync term) reads them from here.
    """
    if tied_table_ranks(plan, model) is None:
        return costs
    copy = next(n for name, _, n in layer_params(model, plan.tp, plan) if name == "lm_head")
    return [dataclasses.replace(c, param_count=copy) if c.name == "lm_head" else c for c in costs]


def assign_layers(costs: list[LayerCost], model: Model, plan: Plan) -> list[list[LayerCost]]:
    """Split the pipeline-ordered layer costs into virtual stages (:func:`~mindpipe.traces.layout.stage_layout`).

    The layer costs do not depend on the partition; what does (a tied head's copy of the table) is
    added here by :func:`with_tied_copy`.
    """
    by_name = {c.name: c for c in with_tied_copy(costs, model, plan)}
    for c in costs:  # a block cut by a stage boundary runs as its parts (traces/layout.py)
        if c.parts is not None:
            by_name.update((p.name, p) for p in c.parts)
    return [[by_name[n] for n in span.layer_names()] for span in stage_layout(plan, model)]


def block_rerun_s(c: LayerCost, policy: BlockPolicy) -> float:
    """Seconds block ``c`` re-runs of its forward before its backward under ``policy``."""
    if policy == "full":
        return c.forward_s
    if policy == "selective":
        return c.recompute_selective_s
    if policy == "nongemm":
        return c.recompute_nongemm_s
    return 0.0


def stage_recompute(layers: list[LayerCost], policies: list[BlockPolicy]) -> tuple[float, list[Collective], int]:
    """(re-run forward seconds, re-issued collectives, swapped blocks) of a stage's blocks.

    ``policies`` are the stage's blocks' policies in order (:func:`mindpipe.traces.layout.block_policies`).
    """
    blocks = [c for c in layers if c.kind == "block"]
    seconds, comm, swapped = 0.0, [], 0
    for c, policy in zip(blocks, policies, strict=True):
        seconds += block_rerun_s(c, policy)
        if policy == "full":
            comm += c.forward_comm
        elif policy in ("selective", "nongemm"):
            # The attention core runs again, so under context parallelism its K/V ring does too.
            comm += [x for x in c.forward_comm if x.axis == "cp"]
        elif policy == "swap":
            swapped += 1
    return seconds, comm, swapped


def weight_pass_extra(model: Model, span: StageSpan, layers: list[LayerCost], policies: list[BlockPolicy],
                      split_backward: bool) -> tuple[float, list[Collective]]:
    """(seconds, TP collectives) a split backward's W of stage ``span`` runs beyond its weight gradients.

    ``layers`` are the stage's layer costs, ``policies`` the plan's block policies. Nothing without a
    split backward or on the first stage. Where the executor takes one W pass
    (:func:`mindpipe.traces.layout.one_weight_pass`): the stage's re-run forward once more
    (:func:`stage_recompute`: full blocks, selective cores) and the blocks' input gradients, which
    the pass walks again, with their collectives. Otherwise torch's pass per parameter group: a
    fully recomputed block (or part) re-runs its forward once per group
    (:func:`mindpipe.traces.layout.weight_groups`); a selective block's core is not on any group's
    path and is not re-run.
    """
    if not split_backward or span.stage == 0:
        return 0.0, []
    own = [policies[b] for b in span.blocks]
    blocks = [c for c in layers if c.kind == "block"]
    if one_weight_pass(model, span, policies):
        seconds, comm, _ = stage_recompute(layers, own)
        return (seconds + sum(c.backward_input_s for c in blocks),
                comm + [x for c in blocks for x in c.backward_comm])
    seconds, comm = 0.0, []
    for c, policy, (_, part) in zip(blocks, own, span.parts(), strict=True):
        if policy == "full":
            k = weight_groups(model, part)
            seconds += k * c.forward_s
            comm += list(c.forward_comm) * k
    return seconds, comm


def _count_ops(ops: Sequence[Op]) -> tuple[float, float, float, float]:
    """A layer's operators with a host overhead of their own (:class:`~mindpipe.simulator.ops.Op`
    ``inner`` ones run inside another's kernel), as its forward "time"."""
    return float(sum(1 for op in ops if not op.inner)), 0.0, 0.0, 0.0


def stage_op_counts(model: Model, plan: Plan) -> list[list[LayerCost]]:
    """Each virtual stage's layers with their forward operator counts as ``forward_s`` (a stage
    boundary inside a block leaves its part's), for :func:`split_backward_walks`."""
    return assign_layers(op_layer_costs(model, plan, _count_ops), model, plan)


def split_backward_walks(model: Model, plan: Plan, span: StageSpan, counts: list[LayerCost],
                         policies: list[BlockPolicy]) -> tuple[float, float, float]:
    """What a split backward's host work on stage ``span`` scales with, beyond its operators:
    (operators I walks, W's autograd passes, operators W's passes walk). Zero on the first stage,
    whose I does nothing and whose W is one ordinary backward.

    ``counts`` are the stage's layers with their operator counts (:func:`stage_op_counts`),
    ``policies`` the plan's block policies. Torch's I (``stage_backward_input``) walks the stage's
    autograd graph in Python to group its parameters before its gradient pass: the stage's
    operators, once. Its W (``stage_backward_weight``) takes one ``autograd.grad`` per parameter
    group (:func:`mindpipe.traces.layout.weight_groups` per block or part, the final norm's, and the
    LM head's unless it is fused into the loss, whose dW is taken in I), and each pass's graph task
    walks from its group down to the stage's input: the operators of its layer and every layer
    before it on the stage. Where the executor merges the groups
    (:func:`mindpipe.traces.layout.one_weight_pass`): one pass over the stage. Measured on this CPU
    (``benchmarks/split_backward_cpu.py``, middle stages of 1–8 GPT blocks at h = 64): I's extra
    grows with the blocks, W's with its passes and, more slowly, their walks. The calibration fits
    the host time of each (:class:`~mindpipe.traces.calibration.ComputeCalibration`)."""
    if span.stage == 0:
        return 0.0, 0.0, 0.0
    total = sum(c.forward_s for c in counts)
    if one_weight_pass(model, span, policies):
        return total, 1.0, total
    parts = iter(span.parts())
    passes = walked = reach = 0.0
    for c in counts:
        walked += c.forward_s
        groups = (weight_groups(model, next(parts)[1]) if c.kind == "block" else 1 if c.kind == "final_norm"
                  else 0 if c.kind != "lm_head" or plan.fused_head_loss else 1)
        passes += groups
        reach += groups * walked
    return total, passes, reach


def optimizer_shard(plan: Plan, params: float) -> float:
    """Parameters whose optimizer step one device runs: all of its own, or a 1/(dp·cp) shard under ZeRO ≥ 1."""
    return params / plan.grad_replicas if plan.zero_stage >= 1 else params


def rank_params(stages: list[list[LayerCost]], stage_to_rank: list[int], pp: int) -> list[int]:
    """Parameters on each pipeline rank's device (after TP sharding): the sum over its stages' layers."""
    out = [0] * pp
    for s, layers in enumerate(stages):
        out[stage_to_rank[s]] += sum(c.param_count for c in layers)
    return out


def _merge(colls: list[Collective]) -> list[tuple[str, float, str, int]]:
    """Collapse back-to-back collectives of one kind, size and group into (op, bytes, axis, count)."""
    counts = Counter((c.op, c.nbytes, c.axis) for c in colls)
    return [(op, n, axis, k) for (op, n, axis), k in counts.items()]


def _tp_phases(topo: Topology, colls: list[Collective], rank: int) -> list[Phase]:
    out: list[Phase] = []
    for op, nbytes, axis, count in _merge(colls):
        out += topo.collective(op, nbytes, axis, rank, count=count)
    return out


def _tp_overlaps(topo: Topology, colls: list[Collective], rank: int) -> list[TpOverlap]:
    """The collectives of ``colls`` that pipeline with compute, equal ones merged: a TP collective with
    its GEMM under ``tp_comm_overlap``, in ``tp`` chunks (TE's ring exchange splits the GEMM into one
    chunk per TP rank); context parallelism's K/V ring with the attention core, in ``cp`` steps."""
    counts = Counter((c.op, c.nbytes, c.axis, c.overlap_s) for c in colls if c.overlap_s > 0)
    return [TpOverlap(topo.collective(op, nbytes, axis, rank), g, topo.plan.cp if axis == "cp" else topo.plan.tp, k)
            for (op, nbytes, axis, g), k in counts.items()]


def _buckets(topo: Topology, op: str, total_params: int, bytes_per_param: int, bucket: int, rank: int) -> list[list[Phase]]:
    if total_params <= 0 or topo.plan.grad_replicas == 1:
        return []
    n = max(1, math.ceil(total_params / bucket))
    per = total_params / n
    return [topo.collective(op, per * bytes_per_param, "dp", rank) for _ in range(n)]


def _gather_units(topo: Topology, layers: list[LayerCost], bytes_per_param: int, rank: int) -> list[list[Phase]]:
    """A sharded stage's parameter all-gathers, one per module the data-parallel wrapper shards
    (FSDP2's ``fully_shard`` units, :func:`~mindpipe.traces.layout.data_parallel_units`): the stage's
    own parameters (token table, final norm, LM head: the root module's) first, then each block's
    (or part of a block's), in the order a forward needs them. Empty without gradient replicas."""
    if topo.plan.grad_replicas == 1:
        return []
    root = sum(c.param_count for c in layers if c.kind != "block")
    units = [root] + [c.param_count for c in layers if c.kind == "block"]
    return [topo.collective("allgather", n * bytes_per_param, "dp", rank) for n in units if n > 0]


def build_work(
    model: Model,
    plan: Plan,
    costs: list[LayerCost],
    compute: ComputeModel,
    topo: Topology,
    stage_to_rank: list[int],
    swap_bytes_per_block: float = 0.0,
    dp_unit_s: float = 0.0,
    swap_on_compute: tuple[float, float, float] | None = None,
    split_backward: bool = False,
    copy_s_per_byte: float = 0.0,
    swap_block_copy_s: float = 0.0,
    swap_reread_bytes_per_block: float = 0.0,
    split_host_s: tuple[float, float, float] = (0.0, 0.0, 0.0),
) -> tuple[list[StageWork], list[RankWork], list[int]]:
    """Per-stage work, per-rank work and per-rank parameter counts for the engine.

    ``swap_bytes_per_block`` is what one swapped block copies to the host and back per micro-batch
    (its activations kept whole, :func:`mindpipe.simulator.memory.activation_bytes_per_layer`).
    ``dp_unit_s`` is the host time of the data-parallel wrapper's hooks per wrapped module
    (:func:`mindpipe.traces.layout.data_parallel_units`) per forward and per backward (calibrated).
    ``swap_on_compute`` (CPU ranks, whose swap is a synchronous copy on the rank's thread:
    :func:`mindpipe.simulator.costs.cpu_copy_s`) is the seconds per swapped block added to the
    forward, to the input gradient (I, and so B) and to the weight gradient (W); the copies then
    use no link. ``split_backward`` (the schedule has I and W actions): W's extra work
    (:func:`weight_pass_extra`, :attr:`StageWork.weight_rerun_s`). ``copy_s_per_byte`` is the
    rank's compute time per byte of a device-to-device copy (each byte read and written once): a
    stage under FSDP2 (:func:`~mindpipe.traces.layout.copies_dp_buffers`) copies each gather of its
    weights out of the all-gather buffer into its parameters (:attr:`StageWork.gather_copy_s`) and
    its gradients into the reduction's input buffer (:attr:`StageWork.reduce_copy_s`).
    ``swap_block_copy_s`` is one swapped block's copy alone on the host link, for the copies back
    during the backward (:func:`~mindpipe.simulator.work.swap_chain_stall_s`).
    ``swap_reread_bytes_per_block`` is what a split backward's W copies back again per swapped
    block (:func:`~mindpipe.simulator.costs.swap_weight_reread_bytes`; :attr:`StageWork.swap_weight_in`).
    ``split_host_s`` is a split backward's host time per operator I walks, per W pass and per
    operator W's passes walk (calibrated; :func:`split_backward_walks`), added to I and to W's extra.
    """
    stages = assign_layers(costs, model, plan)
    policies = block_policies(plan, model.num_layers)
    spans = stage_layout(plan, model)
    on_compute = swap_on_compute or (0.0, 0.0, 0.0)
    lazy = lazy_copy_back(plan)
    counts = stage_op_counts(model, plan) if split_backward and any(split_host_s) else None
    works = []
    for s, layers in enumerate(stages):
        recompute, re_comm, swapped = stage_recompute(layers, [policies[b] for b in spans[s].blocks])
        rerun, rerun_comm = weight_pass_extra(model, spans[s], layers, policies, split_backward)
        walks = split_backward_walks(model, plan, spans[s], counts[s], policies) if counts else (0.0, 0.0, 0.0)
        hooks = dp_unit_s * data_parallel_units(plan, spans[s].num_blocks)
        times = (sum(c.forward_s for c in layers) + hooks + swapped * on_compute[0],
                 sum(c.backward_input_s for c in layers) + hooks + swapped * on_compute[1] + split_host_s[0] * walks[0],
                 sum(c.backward_weight_s for c in layers) + swapped * on_compute[2], recompute,
                 rerun + split_host_s[1] * walks[1] + split_host_s[2] * walks[2])
        if split_backward and s == 0:
            # The first stage's input is token ids: torch's I computes nothing there and its W is the
            # whole backward, re-runs included (executor/torch_pipelining.py; the calibration's
            # features and the memory model count it so too).
            times = (times[0], 0.0, times[2], 0.0, times[4] + times[3] + times[1])
        swaps = [policies[b] == "swap" for b in spans[s].blocks] if swap_on_compute is None else []
        stream = swap_stream_window_s([c.forward_s for c in layers if c.kind == "block"], swaps)
        swap = swapped * swap_bytes_per_block if swap_on_compute is None else 0.0
        work = _stage_work(plan, stages, s, topo, stage_to_rank, times, re_comm, rerun_comm, swap,
                           swap_out_tail_s(swap, swapped), stream)  # the planners' tail rule, in bytes
        if swap > 0:  # the copies back: the last swapped block's before the backward, the others in it
            work.swap_lazy = s in lazy
            work.swap_in = topo.swap(stage_to_rank[s], swap_bytes_per_block, "in")
            if swapped > 1:
                work.swap_chain_in = topo.swap(stage_to_rank[s], swap - swap_bytes_per_block, "in")
            if split_backward and swap_reread_bytes_per_block > 0:
                work.swap_weight_in = topo.swap(stage_to_rank[s], swapped * swap_reread_bytes_per_block, "in")
            blocks = [c for c in layers if c.kind == "block"]
            own = [policies[b] for b in spans[s].blocks]
            work.swap_chain_s, work.swap_lowest_s = swap_chain(
                [c.backward_input_s + (0.0 if split_backward else c.backward_weight_s) + block_rerun_s(c, p)
                 for c, p in zip(blocks, own, strict=True)],
                [swap_block_copy_s if p == "swap" else None for p in own])
        if copies_dp_buffers(plan):
            # FSDP2 copies each gathered parameter out of the gather's flat buffer on the compute
            # stream once the gather lands (every gathered byte read and written once), and before
            # each reduction the gradients into one flat buffer in the reduction's dtype.
            params = sum(c.param_count for c in layers)
            work.gather_copy_s = copy_s_per_byte * DTYPE_BYTES[plan.precision] * params
            work.reduce_copy_s = copy_s_per_byte * (DTYPE_BYTES[plan.precision] + GRAD_BYTES[plan.precision]) / 2 * params
        works.append(work)
    params_by_rank = rank_params(stages, stage_to_rank, plan.pp)
    return works, _rank_works(model, plan, stages, stage_to_rank, params_by_rank, compute, topo), params_by_rank


def _stage_work(plan: Plan, stages: list[list[LayerCost]], s: int, topo: Topology, stage_to_rank: list[int],
                times: tuple[float, float, float, float, float], re_comm: list[Collective],
                rerun_comm: list[Collective], swap: float, swap_tail: float = 0.0, swap_stream_s: float = 0.0) -> StageWork:
    """Stage ``s``'s work: ``times`` (F, I, W, the re-run forward before I, a split backward's extra
    in W), and its transfers: tensor-parallel collectives (the layers', the re-run forward's
    ``re_comm`` and W's extra ``rerun_comm``), sends to its neighbours, data-parallel and ZeRO
    buckets, and the swap of ``swap`` bytes over the host link (``swap_tail`` of them, the last
    swapped block's, copied out after the forward, the rest during its last ``swap_stream_s``)."""
    layers, rank = stages[s], stage_to_rank[s]
    fwd_comm = [x for c in layers for x in c.forward_comm]
    bwd_comm = [x for c in layers for x in c.backward_comm]
    params = sum(c.param_count for c in layers)
    dbytes, gbytes, bucket = DTYPE_BYTES[plan.precision], GRAD_BYTES[plan.precision], bucket_params(plan)
    in_bytes = stages[s - 1][-1].output_bytes if s > 0 else 0
    nxt = stage_to_rank[s + 1] if s + 1 < len(stages) else None
    prv = stage_to_rank[s - 1] if s > 0 else None
    zero = plan.zero_stage
    every = reduces_every_microbatch(plan)
    before = gathers_before_forward(plan)
    allgather = _gather_units(topo, layers, dbytes, rank) if before or every else []
    gathers = allgather if before else []
    return StageWork(
        forward_s=times[0], input_s=times[1], weight_s=times[2], recompute_s=times[3], weight_rerun_s=times[4],
        rerun_tp=_tp_phases(topo, rerun_comm, rank),
        fwd_tp=_tp_phases(topo, fwd_comm, rank),
        bwd_tp=_tp_phases(topo, re_comm + bwd_comm, rank),
        send_fwd=topo.p2p(rank, nxt, layers[-1].output_bytes) if nxt is not None and nxt != rank else None,
        send_bwd=topo.p2p(rank, prv, in_bytes) if prv is not None and prv != rank else None,
        dp_buckets=_buckets(topo, "allreduce" if zero == 0 else "reducescatter", params, gbytes, bucket, rank),
        gather_buckets=gathers,
        regather_buckets=gathers if reshards_after_forward(plan) else [],
        forward_regather_buckets=allgather if every else [],
        reduce_every_backward=every,
        swap_out=topo.swap(rank, swap - swap_tail, "out") if swap - swap_tail > 0 else [],
        swap_out_tail=topo.swap(rank, swap_tail, "out") if swap_tail > 0 else [],
        swap_in=topo.swap(rank, swap, "in") if swap > 0 else [],
        swap_stream_s=swap_stream_s,
        fwd_tp_overlap=_tp_overlaps(topo, fwd_comm, rank),
        bwd_tp_overlap=_tp_overlaps(topo, re_comm + bwd_comm, rank),
    )


def _rank_works(model: Model, plan: Plan, stages: list[list[LayerCost]], stage_to_rank: list[int],
                params_by_rank: list[int], compute: ComputeModel, topo: Topology) -> list[RankWork]:
    """Each pipeline rank's work outside its stages: the optimizer step over its (ZeRO) shard, ZeRO-1/2's
    parameter all-gather after the step (Megatron's distributed optimizer), a tied token table's gradient exchange between its two holders, and
    under sequence parallelism the all-reduce of each of its stages' norms' partial gradients
    (:func:`~mindpipe.simulator.costs.partial_grad_params`; the executor's one per stage, where
    Megatron-LM flattens a rank's model chunks into one)."""
    dbytes, gbytes, bucket = DTYPE_BYTES[plan.precision], GRAD_BYTES[plan.precision], bucket_params(plan)
    tied = tied_table_ranks(plan, model)
    ranks: list[RankWork] = []
    for r in range(plan.pp):
        shard = optimizer_shard(plan, params_by_rank[r])
        # Megatron's distributed optimizer gathers ZeRO-1/2's shards after the step (FSDP2 before
        # the first forward: gathers_before_forward, the stages' gather units).
        gather = (_buckets(topo, "allgather", params_by_rank[r], dbytes, bucket, r)
                  if plan.zero_stage in (1, 2) and not gathers_before_forward(plan) else [])
        rank_work = RankWork(optimizer_s=compute.optimizer_step_s(int(shard), plan), param_gather=gather)
        for s, layers in enumerate(stages):  # one message per stage, as the executor reduces them
            if stage_to_rank[s] == r and (partial := partial_grad_params(model, plan, layers)):
                rank_work.partial_grad_reduce += topo.collective("allreduce", partial * gbytes, "tp", r)
        if tied is not None and tied[0] != tied[1] and r in tied:
            # Each rank's piece of the table's gradient (its ZeRO shard) goes to its peer and back:
            # a two-rank all-reduce moves the piece once each way (one rank holding both adds in place).
            peer = tied[1] if r == tied[0] else tied[0]
            head = next(c for c in stages[-1] if c.kind == "lm_head")
            piece = optimizer_shard(plan, head.param_count) * gbytes
            rank_work.tied_exchange, rank_work.tied_peer = topo.p2p(r, peer, int(piece)), peer
        ranks.append(rank_work)
    return ranks


__all__ = ["GRAD_BYTES", "assign_layers", "bucket_params", "build_work", "optimizer_shard", "rank_params",
           "split_backward_walks", "stage_op_counts", "stage_recompute", "weight_pass_extra", "with_tied_copy"]
