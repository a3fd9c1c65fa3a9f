"""What the engine needs to know about compute and communication, and two ways to get it.

The engine times a schedule from :class:`LayerCost` records (one per pipeline layer: embedding,
blocks, final norm, LM head) and prices every transfer with a :class:`CommModel`. Compute comes
either from a trace (:class:`TraceComputeModel`: profiled or imported per-layer times) or from a
hardware model (:class:`RooflineComputeModel` here; the shape-aware GPU model of
:mod:`mindpipe.simulator.perf` implements the same protocol).

Units: seconds, bytes; everything is for one micro-batch on one device (one tensor-parallel rank).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from mindpipe.simulator.block_parts import OpBlock, UnitSums, op_blocks, part_params, split_halves, split_ops
from mindpipe.simulator.collectives import ring_steps
from mindpipe.simulator.ops import Op, block_ops, embedding_ops, final_norm_ops, lm_head_ops
from mindpipe.traces.catalog import DeviceSpec
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import tied_table_ranks
from mindpipe.traces.trace import LayerRecord, Trace

# Bytes per activation/weight element under each plan precision. ``fp8`` keeps activations,
# weights and the collectives' buffers in bf16 (Transformer Engine's FP8 recipe casts only the
# inputs of the blocks' GEMMs; NVIDIA TE docs, "Using FP8 with Transformer Engine"; torchao's
# float8 training does the same per nn.Linear), so its element is 2 bytes; the 1-byte GEMM operands
# are :data:`GEMM_OPERAND_BYTES`'s.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
# Bytes per operand element of the blocks' linear-layer GEMMs where it differs from DTYPE_BYTES:
# FP8 E4M3/E5M2 (Micikevicius et al. 2022, arXiv 2209.05433).
GEMM_OPERAND_BYTES = {"fp8": 1}
# The 16-bit precision everything but the FP8 GEMMs runs at under each plan precision.
NON_GEMM_PRECISION = {"fp8": "bf16"}


@dataclass(frozen=True, slots=True)
class Collective:
    """A collective a layer issues inside its compute; ``nbytes`` is the full buffer on each rank
    (fractional for an average share: each of a chunked loss's pieces, :func:`vocab_collectives`).

    ``overlap_s`` is the compute it pipelines with (seconds on one rank): the GEMM beside a
    tensor-parallel collective under ``tp_comm_overlap`` (:func:`tp_overlap_gemms`), the attention
    core under a context-parallel ring (:func:`cp_collectives`); 0 when it runs on its own as
    Megatron issues it. ``axis`` is the group: ``tp``, or ``cp`` for context parallelism's K/V ring.
    """

    op: str
    nbytes: float
    overlap_s: float = 0.0
    axis: Literal["tp", "cp"] = "tp"


@dataclass(slots=True)
class LayerCost:
    """Cost of one pipeline layer for one micro-batch on one TP rank, compute only.

    Attributes:
        name, kind: Layer name and role (``embedding``, ``block``, ``final_norm``, ``lm_head``).
        forward_s: Forward compute.
        backward_input_s: Input-gradient compute (I, Qi et al.'s B).
        backward_weight_s: Weight-gradient compute (W).
        recompute_selective_s: Forward compute of the attention core, re-run by selective
            recompute (Korthikanti et al. §5); full recompute re-runs ``forward_s``.
        forward_comm: TP collectives of the forward, in issue order.
        backward_comm: TP collectives of the input-gradient pass.
        output_bytes: Bytes that cross a pipeline boundary placed after this layer (per rank).
        param_count: Parameters this rank holds for the layer (after TP sharding).
        parts: A block's attention and MLP parts, priced on their own for a stage boundary inside
            the block (:mod:`mindpipe.simulator.block_parts`); the attention part's
            ``output_bytes`` is what that boundary sends.
        recompute_nongemm_s: Forward compute of every operator but the GEMMs (the attention core,
            LayerNorms, GeLU, dropouts, residual adds), re-run by the ``nongemm`` policy
            (:mod:`mindpipe.traces.layout`).
    """

    name: str
    kind: str
    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    recompute_selective_s: float = 0.0
    forward_comm: list[Collective] = field(default_factory=list)
    backward_comm: list[Collective] = field(default_factory=list)
    output_bytes: int = 0
    param_count: int = 0
    parts: tuple[LayerCost, LayerCost] | None = None
    recompute_nongemm_s: float = 0.0


class ComputeModel(Protocol):
    """Anything that prices the layers of a model under a plan."""

    def layer_costs(self, model: Model, plan: Plan) -> list[LayerCost]:
        """Per-layer costs in pipeline order (embedding, blocks…, final_norm, lm_head)."""
        ...

    def optimizer_step_s(self, params_per_device: int, plan: Plan) -> float:
        """Time of the optimizer step over ``params_per_device`` parameters."""
        ...


class CommModel(Protocol):
    """Latency and achieved bandwidth of collectives and p2p on a link type.

    The engine decides which links a transfer crosses and how many bytes go over each (ring
    algorithms, hierarchical all-reduce); the comm model says how fast a link really moves them.
    """

    def latency_s(self, op: str, group_size: int, link: str) -> float:
        """Fixed (size-independent) time of one ``op`` over ``group_size`` ranks on ``link``."""
        ...

    def efficiency(self, op: str, nbytes: int, group_size: int, link: str) -> float:
        """Achieved fraction (0, 1] of the link's bandwidth for a message of ``nbytes``."""
        ...


# -- per-layer communication and parameters (shared by every compute model) ------------------------


def tp_collectives(model: Model, plan: Plan, seq_len: int | None = None) -> tuple[list[Collective], list[Collective]]:
    """Megatron's TP collectives of one block: forward and input-gradient pass.

    Without sequence parallelism: one all-reduce after attention and one after the MLP in the
    forward (operator g), and the conjugate two in the backward (operator f) — Shoeybi et al.
    2019, Fig. 4. With sequence parallelism each all-reduce becomes an all-gather before and a
    reduce-scatter after the parallel region (Korthikanti et al. §4.2.2): same bytes on the wire.
    Its backward, per sub-layer: the all-gather of the output gradient (the reduce-scatter's
    conjugate), then the all-gather of the sub-layer's input again — its first GEMM saves only
    this rank's sequence shard and gathers it for the weight gradient (Megatron-LM's
    ``LinearWithGradAccumulationAndAsyncCommunication``, the executor's
    :mod:`mindpipe.executor.sp_linear`) — and the reduce-scatter of the input gradient.
    """
    if plan.tp == 1:
        return [], []
    s = seq_len or model.seq_len
    nbytes = plan.micro_batch_size * s * model.hidden_size * DTYPE_BYTES[plan.precision]
    if plan.sequence_parallel:
        gather, scatter = Collective("allgather", nbytes), Collective("reducescatter", nbytes)
        return [gather, scatter] * 2, [gather, gather, scatter] * 2
    return [Collective("allreduce", nbytes)] * 2, [Collective("allreduce", nbytes)] * 2


def partial_grad_params(model: Model, plan: Plan, layers: Sequence[LayerCost]) -> int:
    """Parameters of ``layers`` whose gradients end the backward as partial sums over the TP group.

    Under sequence parallelism a norm (GPT's LayerNorm, Llama's RMSNorm) keeps its weights
    replicated but sees only this rank's s/t tokens, so its weight gradient is this rank's part of
    a sum over the group: a block's two norms (one per part of a block cut by a stage boundary)
    and the final norm. Megatron-LM all-reduces them once per iteration, flattened into one message
    over the TP group, after the data-parallel reduction and before the optimizer step
    (``finalize_model_grads`` → ``_allreduce_layernorm_grads``; Megatron adds the row-parallel
    biases, which the executor's layout reduces inside the layer); so does the executor
    (:func:`mindpipe.executor.partial_grads.reduce_partial_grads`). 0 without sequence parallelism
    (every rank computes the whole gradient).
    """
    if plan.tp == 1 or not plan.sequence_parallel:
        return 0
    norms = 0
    for c in layers:
        if c.kind == "block":
            norms += 1 if c.name.endswith((".attention", ".mlp")) else 2
        elif c.kind == "final_norm":
            norms += 1
    return norms * model.norm_param_count()


def cp_collectives(model: Model, plan: Plan, seq_len: int, core_s: tuple[float, float] = (0.0, 0.0)
                   ) -> tuple[list[Collective], list[Collective]]:
    """Context parallelism's K/V exchange of one block (forward, input-gradient pass), on the ``cp`` group.

    ``p2p``, Transformer Engine's ``AttnFuncWithCPAndKVP2P`` (Megatron-core ``--context-parallel-size``;
    the executor's ring, :mod:`mindpipe.traces.torch_context_parallel`):
    in the forward each rank passes its K and V chunk (``seq_len`` tokens, the local K/V heads) to
    the next rank cp − 1 times, so every rank sees every chunk — the bytes of an all-gather of
    the whole sequence's K and V; in the backward K and V go round again and the partial dK and dV
    come back to their owners — an all-gather and a reduce-scatter, an all-reduce's bytes. Each
    step's exchange runs under the previous step's attention kernel: ``core_s`` is the core's
    (forward, backward) seconds on one rank, which the ring pipelines with in cp chunks.
    ``allgather`` (the executor's, :mod:`mindpipe.traces.torch_context_parallel`): the same bytes as
    a blocking all-gather before the forward's kernel, and in the backward an all-gather before
    it and a reduce-scatter of dK and dV after it, none overlapped.
    """
    if plan.cp == 1:
        return [], []
    kv = 2 * plan.micro_batch_size * seq_len * plan.cp * (model.kv_width // plan.tp) * DTYPE_BYTES[plan.precision]
    if plan.cp_comm_type == "allgather":
        return ([Collective("allgather", kv, 0.0, "cp")],
                [Collective("allgather", kv, 0.0, "cp"), Collective("reducescatter", kv, 0.0, "cp")])
    return ([Collective("allgather", kv, core_s[0], "cp")], [Collective("allreduce", kv, core_s[1], "cp")])


def vocab_collectives(model: Model, plan: Plan, seq_len: int | None = None) -> dict[str, tuple[list[Collective], list[Collective]]]:
    """Megatron's TP collectives of the vocabulary-parallel layers, (forward, input-gradient pass)
    by layer kind (``embedding``, ``lm_head``; empty for every kind at tp 1).

    Embedding (``VocabParallelEmbedding``): each rank looks up its rows and the partial outputs are
    all-reduced, or reduce-scattered along the sequence under sequence parallelism (whose backward
    is the conjugate all-gather). Cross-entropy (``vocab_parallel_cross_entropy``): three
    all-reduces of one fp32 value per token in the forward (row maximum, target logit, sum of
    exponentials), none in the backward. The head is column-parallel (Megatron's output layer), so
    its input gradient's partial sums are all-reduced in the backward (operator f); under sequence
    parallelism its input (the final norm's sequence shard) is all-gathered first and its gradient
    reduce-scattered instead, and the backward all-gathers the input again for the weight gradient:
    the GEMM saves only this rank's shard (Megatron-LM's output layer; the executor's
    :mod:`mindpipe.executor.sp_linear`, since 2026-12-05 — before, its ``ColwiseParallel`` head
    saved the gathered input). The executor's embedding all-reduces and then cuts the
    sequence under sequence parallelism (:func:`mindpipe.traces.torch_gpt.vocab_parallel_embedding`):
    twice a reduce-scatter's bytes, once per micro-batch. The LM head fused into the loss
    (``fused_head_loss``, :mod:`mindpipe.traces.torch_head_loss`): per piece, the row maximum and the
    sum of exponentials in the forward and again in the backward, the loss's sum once; the input
    gradient's partial sums all-reduced, or under sequence parallelism the input all-gathered in
    the forward and again in the backward and its gradient reduce-scattered.
    """
    if plan.tp == 1:
        return {}
    tokens = plan.micro_batch_size * (seq_len or model.seq_len)
    nbytes = tokens * model.hidden_size * DTYPE_BYTES[plan.precision]
    if plan.sequence_parallel:
        emb = [Collective("reducescatter", nbytes)], [Collective("allgather", nbytes)]
    else:
        emb = [Collective("allreduce", nbytes)], []
    if not plan.fused_head_loss:
        loss = [Collective("allreduce", 4 * tokens)] * 3
        if plan.sequence_parallel:
            regather = Collective("allgather", nbytes)
            return {"embedding": emb, "lm_head": ([regather, *loss], [regather, Collective("reducescatter", nbytes)])}
        return {"embedding": emb, "lm_head": (loss, [Collective("allreduce", nbytes)])}
    c = plan.loss_chunks
    pieces = [Collective("allreduce", 4 * tokens / c)] * (2 * c)
    gather = [Collective("allgather", nbytes)] if plan.sequence_parallel else []
    grad = Collective("reducescatter" if plan.sequence_parallel else "allreduce", nbytes)
    return {"embedding": emb, "lm_head": (gather + pieces + [Collective("allreduce", 8)], gather + pieces + [grad])}


# The GEMM each TP collective of a block pipelines with under ``tp_comm_overlap``, in the order of
# :func:`tp_collectives` (attention half, then MLP half), as Transformer Engine's userbuffers pair
# them (``transformer_engine/pytorch/module/{layernorm_linear,linear,layernorm_mlp}.py``; the
# per-GEMM methods in NeMo-Framework-Launcher ``launcher_scripts/conf/training/tp_overlap/
# ub_cfg_h100_*.yaml``): forward — the all-gather of the normed input with the QKV (or Q, K, V)
# GEMM (``qkv_fprop``), the reduce-scatter of the output with the projection (``proj_fprop``), and
# likewise fc1 (gate, up) and fc2 (down); backward (input gradient) — the all-gather of the output
# gradient with the projection's dgrad (``proj_dgrad``) and the reduce-scatter of the input
# gradient with the QKV dgrad, and likewise for the MLP. Under sequence parallelism the input's
# all-gather again for the weight gradient runs in bulk under the QKV dgrad (``qkv_dgrad``,
# ``ub_bulk_dgrad``), and TE overlaps the reduce-scatter with the weight-gradient GEMM in bulk
# (``qkv_wgrad``); the dgrad GEMM has the same FLOPs and stays in the input-gradient pass under
# every schedule (zero-bubble schedules move W elsewhere), so both are paired with it.
# Per kind (Llama or not): the column-parallel attention GEMMs, the projection, the column-parallel
# MLP GEMMs, the row-parallel MLP GEMM (:func:`mindpipe.simulator.ops.block_ops`'s names).
_OVERLAP_GEMMS = {
    False: (("qkv",), ("proj",), ("mlp_fc1",), ("mlp_fc2",)),
    True: (("q", "k", "v"), ("proj",), ("mlp_gate", "mlp_up"), ("mlp_down",)),
}


def tp_overlap_gemms(model: Model, ops: Sequence[Op],
                     price: Callable[[Sequence[Op]], tuple[float, float, float, float]]) -> tuple[list[float], list[float]]:
    """Seconds of the GEMM each forward and each input-gradient TP collective of a block
    (:func:`tp_collectives` under sequence parallelism, which ``tp_comm_overlap`` requires: the
    plan rule) pipelines with under ``tp_comm_overlap`` (:data:`_OVERLAP_GEMMS`), priced by
    ``price`` like the block."""
    groups = _OVERLAP_GEMMS[model.is_llama]

    def seconds(names: tuple[str, ...], phase: str) -> float:
        mine = [op for op in ops if op.kind == "gemm" and op.name in names and op.phase == phase]
        return sum(price([op])[0 if phase == "forward" else 1] for op in mine)

    fwd = [seconds(names, "forward") for names in groups]
    qkv, proj, fc1, fc2 = (seconds(names, "backward_input") for names in groups)
    return fwd, [proj, qkv, qkv, fc2, fc1, fc1]


def with_overlap(colls: Sequence[Collective], gemm_s: Sequence[float]) -> list[Collective]:
    """``colls`` (one block's, :func:`tp_collectives`) each paired with the GEMM seconds it pipelines with."""
    return [Collective(c.op, c.nbytes, g) for c, g in zip(colls, gemm_s, strict=True)]


def layer_params(model: Model, tp: int, plan: Plan | None = None) -> list[tuple[str, str, int]]:
    """(name, kind, parameters per TP rank) of every pipeline layer.

    A tied head owns no parameters, unless ``plan`` puts it on a stage of its own, which then
    holds a copy of the token table (:func:`mindpipe.traces.layout.tied_table_ranks`).
    """
    h, v = model.hidden_size, model.vocab_size
    # Vocabulary-parallel token table; GPT's learned positions are replicated.
    out = [("embedding", "embedding", -(-v // tp) * h + model.embedding_param_count() - v * h)]
    # Column/row-parallel weights shard over t; row-parallel biases and norms are replicated.
    block = sum(part_params(model, tp).values())
    out += [(f"block.{i}", "block", block) for i in range(model.num_layers)]
    copy = plan is not None and tied_table_ranks(plan, model) is not None
    head = -(-v // tp) * h if model.lm_head_param_count() or copy else 0
    out += [("final_norm", "final_norm", model.final_norm_param_count()), ("lm_head", "lm_head", head)]
    return out


def boundary_bytes(model: Model, plan: Plan, seq_len: int | None = None) -> int:
    """Bytes of the hidden state crossing a pipeline boundary per micro-batch per TP rank.

    Megatron sends the full [s, b, h] tensor from every TP rank unless sequence parallelism
    shards it (then 1/t each) — scatter/gather optimisation of Narayanan et al. §4.1 is the same.
    """
    s = seq_len or model.seq_len
    full = plan.micro_batch_size * s * model.hidden_size * DTYPE_BYTES[plan.precision]
    return full // plan.tp if plan.sequence_parallel else full


def op_layer_costs(model: Model, plan: Plan, price: Callable[[Sequence[Op]], tuple[float, float, float, float]]) -> list[LayerCost]:
    """Per-layer costs of a model priced operator by operator (shared by the op-level models).

    The attention core is FlashAttention's fused kernel under the plan's ``flash_attention``
    (vTrain's Megatron-DeepSpeed runs, and the executor by default, run the explicit
    baddbmm/softmax/bmm).

    ``price(ops)`` returns the (forward, input-gradient, weight-gradient, attention-core forward)
    seconds of one layer's operators (:mod:`mindpipe.simulator.ops`); this function adds the layer
    structure, the TP collectives, the pipeline boundary bytes and the parameters.

    Under context parallelism (``plan.cp`` > 1) a rank is priced as the model at s/cp tokens —
    every layer but the attention core, which attends over the whole sequence
    (:func:`~mindpipe.simulator.ops.block_ops`) — plus each block's K/V ring
    (:func:`cp_collectives`).
    """
    d = DTYPE_BYTES[plan.precision]
    b, s, t, sp = plan.micro_batch_size, plan.rank_seq_len(model.seq_len), plan.tp, plan.sequence_parallel
    fwd_comm, bwd_comm = tp_collectives(model, plan, s)
    out_bytes = boundary_bytes(model, plan, s)
    params = {name: n for name, _, n in layer_params(model, t)}
    vocab = vocab_collectives(model, plan, s)
    emb_fwd, emb_bwd = vocab.get("embedding", ([], []))
    head_fwd, head_bwd = vocab.get("lm_head", ([], []))
    f, i, w, _ = price(embedding_ops(model, b, s, t, d))
    layers = [LayerCost("embedding", "embedding", f, i, w, 0.0, emb_fwd, emb_bwd, out_bytes, params["embedding"])]
    ops = block_ops(model, b, s, t, sp, d, flash_attention=plan.flash_attention, cp=plan.cp,
                    cp_comm_type=plan.cp_comm_type, fused_elementwise=plan.fused_elementwise)
    f, i, w, core = price(ops)
    if plan.tp_comm_overlap and fwd_comm:
        g_fwd, g_bwd = tp_overlap_gemms(model, ops, price)
        fwd_comm, bwd_comm = with_overlap(fwd_comm, g_fwd), with_overlap(bwd_comm, g_bwd)
    # Per half (attention, mlp): the TP collectives, with the K/V ring in the attention half.
    core_bwd = price([o for o in ops if o.attention_core and o.phase == "backward_input"])[1] if plan.cp > 1 else 0.0
    cp_fwd, cp_bwd = cp_collectives(model, plan, s, (core, core_bwd))
    (fa, fm), (ba, bm) = split_halves(fwd_comm), split_halves(bwd_comm)
    comm_halves = ((fa + cp_fwd, fm), (ba + cp_bwd, bm))
    fwd_comm, bwd_comm = fa + cp_fwd + fm, ba + cp_bwd + bm
    halves = split_ops(ops)
    split = [price(part) for part in halves]
    # The memory-bound operators outside the attention core, priced by the same model: with the
    # core, what the ``nongemm`` policy re-runs.
    cheap = [price([o for o in part if o.kind == "memory" and not o.attention_core])[0] for part in halves]
    for k in range(model.num_layers):
        name = f"block.{k}"
        whole = LayerCost(name, "block", f, i, w, core, list(fwd_comm), list(bwd_comm), out_bytes, params[name])
        whole.recompute_nongemm_s = core + sum(cheap)
        whole.parts = block_parts(model, plan, whole, [x[:3] for x in split], split[0][3], out_bytes, comm_halves)
        whole.parts[0].recompute_nongemm_s = split[0][3] + cheap[0]
        whole.parts[1].recompute_nongemm_s = cheap[1]
        layers.append(whole)
    f, i, w, _ = price(final_norm_ops(model, b, s, t, sp, d, plan.fused_elementwise))  # s: a context-parallel rank's tokens
    layers.append(LayerCost("final_norm", "final_norm", f, i, w, output_bytes=out_bytes, param_count=params["final_norm"]))
    f, i, w, _ = price(lm_head_ops(model, b, s, t, d, plan.loss_chunks, plan.fused_head_loss))
    layers.append(LayerCost("lm_head", "lm_head", f, i, w, 0.0, head_fwd, head_bwd, 0, params["lm_head"]))
    return layers


def block_parts(model: Model, plan: Plan, whole: LayerCost, times: Sequence[Sequence[float]], core_s: float,
                cut_bytes: int, comm_halves: tuple[tuple[list[Collective], list[Collective]],
                                                   tuple[list[Collective], list[Collective]]] | None = None
                ) -> tuple[LayerCost, LayerCost]:
    """The (attention, mlp) parts of the block ``whole`` (:mod:`mindpipe.simulator.block_parts`).

    ``times`` are each part's (forward, input-gradient, weight-gradient) seconds, ``core_s`` the
    attention core's forward (selective recompute re-runs it, all in the attention part) and
    ``cut_bytes`` what a boundary after the attention part sends. ``comm_halves`` gives each part's
    (forward, backward) collectives; by default ``whole``'s, split in half (one per sub-layer).
    """
    fwd, bwd = (split_halves(whole.forward_comm), split_halves(whole.backward_comm)) if comm_halves is None else comm_halves
    params = part_params(model, plan.tp)
    (fa, ia, wa), (fm, im, wm) = times
    attention = LayerCost(f"{whole.name}.attention", "block", fa, ia, wa, core_s, fwd[0], bwd[0], cut_bytes,
                          params["attention"])
    mlp = LayerCost(f"{whole.name}.mlp", "block", fm, im, wm, 0.0, fwd[1], bwd[1], whole.output_bytes, params["mlp"])
    return attention, mlp


# -- roofline compute model ---------------------------------------------------------------------


def roofline_time(ops: Sequence[Op], peak_flops: float, bandwidth_Bps: float) -> tuple[float, float, float, float]:
    """(forward, backward_input, backward_weight, attention-core forward) seconds of ``ops``.

    Each operator takes max(FLOPs / peak, bytes / bandwidth) (Williams et al. 2009).
    """
    out = {"forward": 0.0, "backward_input": 0.0, "backward_weight": 0.0}
    core = 0.0
    for op in ops:
        t = max(op.flops / peak_flops, op.bytes / bandwidth_Bps)
        out[op.phase] += t
        if op.attention_core and op.phase == "forward":
            core += t
    return out["forward"], out["backward_input"], out["backward_weight"], core


@dataclass
class RooflineComputeModel:
    """Prices operators by the roofline of a catalog device (issue 3's first-order model).

    Attributes:
        device: The catalog entry (peak FLOP/s per dtype, memory bandwidth).
        flops_efficiency: Fraction of peak FLOP/s dense matmuls reach.
        bandwidth_efficiency: Fraction of memory bandwidth memory-bound ops reach.
        optimizer_bytes_per_param: Memory traffic of an Adam step per parameter (read/write of
            fp32 master weights, two moments, gradients, and the low-precision copy).
    """

    device: DeviceSpec
    flops_efficiency: float = 0.75
    bandwidth_efficiency: float = 0.8
    optimizer_bytes_per_param: float = 36.0

    def _peak(self, plan: Plan) -> float:
        return self.device.peak_flops(plan.precision) * self.flops_efficiency

    def layer_costs(self, model: Model, plan: Plan) -> list[LayerCost]:
        """Per-layer roofline costs (see :class:`ComputeModel`)."""
        peak, bw = self._peak(plan), self.device.memory_bandwidth_GBps * 1e9 * self.bandwidth_efficiency
        return op_layer_costs(model, plan, lambda ops: roofline_time(ops, peak, bw))

    def optimizer_step_s(self, params_per_device: int, plan: Plan) -> float:
        """Adam is memory-bound: bytes per parameter over the achieved bandwidth."""
        bw = self.device.memory_bandwidth_GBps * 1e9 * self.bandwidth_efficiency
        return params_per_device * self.optimizer_bytes_per_param / bw


# -- trace-driven compute model -----------------------------------------------------------------


@dataclass
class TraceComputeModel:
    """Per-layer times from a trace (profiled, imported or measured).

    A trace is taken at one micro-batch size and TP degree. For a plan with other values the
    times are scaled linearly in micro-batch size and by (trace tp / plan tp), a first-order
    rule (compute is close to linear in tokens for these shapes); ``scaled`` reports whether that
    happened. Layers are matched by kind: the trace must hold an ``embedding``, the blocks (one
    record per block, or fewer to be repeated cyclically), ``final_norm`` (optional) and
    ``lm_head``. Backward traces that could not be split (``backward_split="combined"``) put the
    whole backward in I and none in W.

    An operator-granularity trace (``mindpipe profile --granularity op``) gives each block as its
    units (:func:`mindpipe.simulator.block_parts.op_blocks`): a block costs the sum of its units,
    its attention and MLP parts the sums of theirs, and a boundary after the attention part sends
    the cut unit's ``output_bytes`` (scaled to the plan's micro-batch and precision). A layer trace
    splits a block's times between the parts in the ratio of the hardware model's operators, except
    where a measured run that cut the block timed its parts (``block_attention``/``block_mlp``
    records, :mod:`mindpipe.executor.stages`).
    """

    trace: Trace
    fallback: ComputeModel | None = None
    source: str = "trace"
    _op_blocks: list[OpBlock] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.trace.granularity == "op":
            self._op_blocks = op_blocks(self.trace, self.source)
        elif "block" not in (kinds := list(dict.fromkeys(r.kind for r in self.trace.layers))):
            shown = ", ".join(kinds[:6]) + (", ..." if len(kinds) > 6 else "")
            raise ContractError(self.source, "layers", f"the trace has no block records (its kinds: {shown}); the "
                                "simulator prices a transformer block per record, as `mindpipe profile` and `mindpipe "
                                "run` write them (an AICB import keeps AICB's own units: compare it with `inspect`)")

    def _scale(self, plan: Plan) -> float:
        mbs = self.trace.micro_batch_size or plan.micro_batch_size
        return (plan.micro_batch_size / mbs) * (self.trace.tp / plan.tp)

    def scaled(self, plan: Plan) -> bool:
        """True when the trace's micro-batch size or TP degree differs from the plan's."""
        return abs(self._scale(plan) - 1.0) > 1e-12

    def block_note(self, model: Model) -> str | None:
        """A note when the trace's whole-block records are not one per block of ``model`` (they are
        used in order, cyclically: fewer repeat, the extra ones go unused); None when they are."""
        n = len(self._op_blocks) if self.trace.granularity == "op" else sum(
            1 for r in self.trace.layers if r.kind == "block")
        if n == model.num_layers or n == 0:
            return None
        how = "repeated in order" if n < model.num_layers else f"the first {model.num_layers} used"
        return f"the trace has {n} block records for the model's {model.num_layers} blocks: {how}"

    def layer_costs(self, model: Model, plan: Plan) -> list[LayerCost]:
        """Per-layer costs from the trace (see class docstring)."""
        if plan.cp > 1:
            # A context-parallel rank's layers run at s/cp tokens, its attention over all s keys.
            raise ContractError(self.source, "cp", f"cp={plan.cp} needs the attention priced at a rank's share of "
                                "the sequence: simulate it with a hardware compute model, not a trace")
        if plan.tp_comm_overlap:
            # The overlap pairs each collective with one GEMM's time (tp_overlap_gemms); a trace's
            # blocks are timed whole.
            raise ContractError(self.source, "tp_comm_overlap", "tp_comm_overlap=true needs per-GEMM times: "
                                "simulate it with a hardware compute model, not a trace")
        if plan.flash_attention != self.trace.flash_attention:
            how = "with" if self.trace.flash_attention else "without"
            raise ContractError(self.source, "flash_attention", (
                f"the trace was profiled {how} flash attention but the plan has flash_attention="
                f"{str(plan.flash_attention).lower()}: profile again (mindpipe profile"
                f"{'' if plan.flash_attention else ' without'} --flash-attention) or simulate with a hardware compute model"))
        k = self._scale(plan)
        by_kind: dict[str, list] = {}
        for r in self.trace.layers:
            by_kind.setdefault(r.kind, []).append(r)
        fwd_comm, bwd_comm = tp_collectives(model, plan)
        out_bytes = boundary_bytes(model, plan)
        params = {name: n for name, _, n in layer_params(model, plan.tp)}
        layers: list[LayerCost] = []
        # Shares of a block's forward in its attention core and its other memory-bound operators
        # (one operator list for every block: they are the same shape).
        core_share, memory_share = _attention_core_share(model, plan), _memory_op_share(model, plan)

        vocab_comm = vocab_collectives(model, plan)

        def from_record(name: str, kind: str, rec: object | None, comm: bool) -> LayerCost:
            fwd, bwd = (fwd_comm, bwd_comm) if comm else vocab_comm.get(kind, ([], []))
            f = rec.forward_s * k if rec is not None else 0.0  # type: ignore[attr-defined]
            i = rec.backward_input_s * k if rec is not None else 0.0  # type: ignore[attr-defined]
            w = rec.backward_weight_s * k if rec is not None else 0.0  # type: ignore[attr-defined]
            # Selective recompute re-runs the attention core; a layer trace does not separate it,
            # so estimate its share of the forward from the operator FLOPs/bytes ratio (roofline).
            core = f * core_share if kind == "block" else 0.0
            cost = LayerCost(name, kind, f, i, w, core, list(fwd), list(bwd), out_bytes if kind != "lm_head" else 0,
                             params[name])
            if kind == "block":
                cost.recompute_nongemm_s = core + f * memory_share
            return cost

        layers.append(from_record("embedding", "embedding", (by_kind.get("embedding") or [None])[0], False))
        layers += self._block_costs(model, plan, from_record, by_kind.get("block", []), memory_share)
        layers.append(from_record("final_norm", "final_norm", (by_kind.get("final_norm") or [None])[0], False))
        head = from_record("lm_head", "lm_head", (by_kind.get("lm_head") or [None])[0], False)
        # A trace times the loss as the profiler runs it, whole; pieces re-run its forward kernels
        # in the backward (chunked_cross_entropy_ops), and a fused head its GEMM as well
        # (fused_head_loss_ops): that share of the head's forward, again.
        head.backward_input_s += head.forward_s * _loss_rerun_share(model, plan)
        layers.append(head)
        return layers

    def _block_costs(self, model: Model, plan: Plan, from_record: Callable[..., LayerCost],
                     records: list[LayerRecord], memory_share: float) -> list[LayerCost]:
        """Every block's cost with its parts, from block records or from operator units (class
        docstring); ``memory_share`` is :func:`_memory_op_share`'s."""
        k = self._scale(plan)
        out: list[LayerCost] = []
        if self.trace.granularity == "op":
            blocks = self._op_blocks
            mbs = self.trace.micro_batch_size or plan.micro_batch_size
            d_trace = DTYPE_BYTES.get(self.trace.dtype, DTYPE_BYTES[plan.precision])
            byte_scale = plan.micro_batch_size / mbs * DTYPE_BYTES[plan.precision] / d_trace
            for j in range(model.num_layers):
                ob = blocks[j % len(blocks)]
                whole = from_record(f"block.{j}", "block", ob.whole, True)
                whole.recompute_selective_s = ob.core_forward_s * k
                whole.recompute_nongemm_s = whole.recompute_selective_s + whole.forward_s * memory_share
                times: Sequence[Sequence[float]] = [(p.forward_s * k, p.backward_input_s * k, p.backward_weight_s * k)
                                                    for p in (ob.attention, ob.mlp)]
                whole.parts = block_parts(model, plan, whole, times, whole.recompute_selective_s,
                                          round(ob.cut_bytes * byte_scale))
                out.append(whole)
            return out
        shares = _attention_part_shares(model, plan)
        timed = {r.name: r for r in self.trace.layers if r.kind in ("block_attention", "block_mlp")}
        n = 0  # whole-block records are used in order, cyclically
        for j in range(model.num_layers):
            pair = timed.get(f"block.{j}.attention"), timed.get(f"block.{j}.mlp")
            if pair[0] is not None and pair[1] is not None:
                # A measured run that cut this block timed its two parts (executor/stages.py).
                whole = from_record(f"block.{j}", "block", UnitSums.of(pair), True)  # type: ignore[arg-type]
                times = [(r.forward_s * k, r.backward_input_s * k, r.backward_weight_s * k) for r in pair]  # type: ignore[union-attr]
            else:
                whole = from_record(f"block.{j}", "block", records[n % len(records)], True)
                n += 1
                phases = (whole.forward_s, whole.backward_input_s, whole.backward_weight_s)
                times = [[t * share for t, share in zip(phases, shares, strict=True)],
                         [t * (1.0 - share) for t, share in zip(phases, shares, strict=True)]]
            whole.parts = block_parts(model, plan, whole, times, whole.recompute_selective_s, whole.output_bytes)
            out.append(whole)
        return out

    def optimizer_step_s(self, params_per_device: int, plan: Plan) -> float:
        """From the trace's update times if it has them, else the fallback model, else 0."""
        ups = [r.update_s for r in self.trace.layers if r.update_s]
        if ups:
            total_params = sum(r.param_count or 0 for r in self.trace.layers) or 1
            return sum(ups) * params_per_device / total_params
        if self.fallback is not None:
            return self.fallback.optimizer_step_s(params_per_device, plan)
        return 0.0


def _plan_block_ops(model: Model, plan: Plan) -> list[Op]:
    """One block's operators under ``plan`` (its attention core as the plan runs it), which the
    shares below split a layer trace's block times by."""
    return block_ops(model, plan.micro_batch_size, model.seq_len, plan.tp, plan.sequence_parallel,
                     DTYPE_BYTES[plan.precision], flash_attention=plan.flash_attention,
                     fused_elementwise=plan.fused_elementwise)


def _attention_part_shares(model: Model, plan: Plan) -> tuple[float, float, float]:
    """Share of a block's forward, input-gradient and weight-gradient work in its attention part,
    by the operators' FLOPs and bytes weighed as in :func:`_attention_core_share`."""
    ops = _plan_block_ops(model, plan)
    attention, _ = split_ops(ops)
    shares = []
    for phase in ("forward", "backward_input", "backward_weight"):
        total = sum(o.flops + 150.0 * o.bytes for o in ops if o.phase == phase)
        part = sum(o.flops + 150.0 * o.bytes for o in attention if o.phase == phase)
        shares.append(part / total if total else 0.5)
    return shares[0], shares[1], shares[2]


def _forward_share(model: Model, plan: Plan, chosen: Callable[[Op], bool]) -> float:
    """Share of a block's forward FLOP+byte work in the operators ``chosen`` picks."""
    ops = [o for o in _plan_block_ops(model, plan) if o.phase == "forward"]
    # Weigh FLOPs against bytes at a typical GPU machine balance (~150 FLOP/byte); the share only
    # sizes selective recompute, a few percent of the step.
    work = [o.flops + 150.0 * o.bytes for o in ops]
    total = sum(work) or 1.0
    return sum(w for o, w in zip(ops, work, strict=True) if chosen(o)) / total


def _attention_core_share(model: Model, plan: Plan) -> float:
    """Share of a block's forward FLOP+byte work in the attention core (for selective recompute)."""
    return _forward_share(model, plan, lambda o: o.attention_core)


def _memory_op_share(model: Model, plan: Plan) -> float:
    """Share of a block's forward work in memory-bound operators outside the attention core
    (LayerNorms, GeLU, dropouts, residual adds: with the core, what ``nongemm`` re-runs)."""
    return _forward_share(model, plan, lambda o: o.kind == "memory" and not o.attention_core)


def _loss_rerun_share(model: Model, plan: Plan) -> float:
    """Share of the LM head's forward FLOP+byte work (weighed as :func:`_attention_core_share`) that
    a plan's pieces of the loss re-run in the backward (with ``fused_head_loss``, the head's GEMM
    too); 0 for an unchunked, unfused loss (``loss_chunks`` 1)."""
    if plan.loss_chunks == 1 and not plan.fused_head_loss:
        return 0.0
    ops = lm_head_ops(model, plan.micro_batch_size, model.seq_len, plan.tp, DTYPE_BYTES[plan.precision],
                      plan.loss_chunks, plan.fused_head_loss)
    forward = sum(o.flops + 150.0 * o.bytes for o in ops if o.phase == "forward")
    rerun = sum(o.flops + 150.0 * o.bytes for o in ops if o.name.endswith("_rerun"))
    return rerun / forward if forward else 0.0


# -- swap copies on a CPU ------------------------------------------------------------------
# A CPU rank's "device" and host are the same RAM: the executor's swap (executor/offload.py) is a
# synchronous clone on the rank's own thread — into the pool when the forward saves a tensor,
# out of it each time a backward node unpacks one — so its time lands inside the compute actions,
# never on a link. (On a GPU the copies run over PCIe on a side stream: Topology.swap.)


def swap_weight_reread_bytes(model: Model, plan: Plan) -> float:
    """Bytes of one swapped block that a split backward's W unpacks again after I unpacked them all.

    torch's ``stage_backward_input`` runs every node of the block (each unpacks all it saved) and
    keeps the graph; ``stage_backward_weight`` then runs the weight-gradient GEMMs again, and each
    unpacks its input X (dW = Xᵀ·dY, :func:`mindpipe.simulator.ops._gemm`): a fresh copy of X.
    Measured on a Linear–GELU–Linear under :func:`mindpipe.executor.offload.swapping`: I unpacks
    every saved byte, W the two Linear inputs.
    """
    d = DTYPE_BYTES[plan.precision]
    ops = block_ops(model, plan.micro_batch_size, model.seq_len, plan.tp, plan.sequence_parallel, d)
    # The weight-gradient op of Y[m,n] = X[m,k]·W[k,n] has gemm_mnk = (k, n, m): X is k·m elements.
    return float(sum(d * op.gemm_mnk[0] * op.gemm_mnk[2] for op in ops
                     if op.phase == "backward_weight" and op.gemm_mnk is not None))


def cpu_copy_s(device: DeviceSpec, nbytes: float, s_per_byte: float = 0.0) -> float:
    """Seconds of a synchronous host copy of ``nbytes`` on a CPU rank (the swap's price on CPUs).

    ``s_per_byte`` is the calibrated price (:attr:`~mindpipe.traces.calibration.ComputeCalibration.
    swap_s_per_byte`, fitted from runs that swap); 0 means uncalibrated: the copy reads and writes
    every byte at the catalog's memory bandwidth (which ``benchmarks/measure_cpu.py`` measures as
    bytes read + written per second of a torch copy).
    """
    if nbytes <= 0:
        return 0.0
    if s_per_byte > 0:
        return s_per_byte * nbytes
    return 2.0 * nbytes / (device.memory_bandwidth_GBps * 1e9)


# -- a simple α-β communication model ---------------------------------------------------------


@dataclass
class AlphaBetaCommModel:
    """Constant latency per algorithm step and constant bandwidth efficiency per link type.

    A collective takes its ring steps (:func:`mindpipe.simulator.collectives.ring_steps`) of latency. The defaults are typical NCCL figures
    (a few µs per step over NVLink, ~10 µs over InfiniBand); :mod:`mindpipe.simulator.perf` fits them to
    measurements and calibration refits them for gloo.
    """

    step_latency_s: dict[str, float] = field(
        default_factory=lambda: {"nvlink": 5e-6, "nic": 10e-6, "pcie": 8e-6, "local": 20e-6}
    )
    link_efficiency: dict[str, float] = field(
        default_factory=lambda: {"nvlink": 0.8, "nic": 0.85, "pcie": 0.8, "local": 0.5}
    )

    def latency_s(self, op: str, group_size: int, link: str) -> float:
        """Latency steps × per-step latency of the link."""
        return max(ring_steps(op, group_size), 1) * self.step_latency_s[link]

    def efficiency(self, op: str, nbytes: int, group_size: int, link: str) -> float:
        """Constant achieved fraction of the link bandwidth."""
        return self.link_efficiency[link]


__all__ = [
    "DTYPE_BYTES",
    "GEMM_OPERAND_BYTES",
    "NON_GEMM_PRECISION",
    "AlphaBetaCommModel",
    "Collective",
    "CommModel",
    "ComputeModel",
    "LayerCost",
    "RooflineComputeModel",
    "TraceComputeModel",
    "block_parts",
    "boundary_bytes",
    "cpu_copy_s",
    "layer_params",
    "op_layer_costs",
    "partial_grad_params",
    "roofline_time",
    "swap_weight_reread_bytes",
    "tp_collectives",
    "tp_overlap_gemms",
    "vocab_collectives",
    "with_overlap",
]
