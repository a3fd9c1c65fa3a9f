"""Operator decomposition of the GPT and Llama layers: FLOPs, bytes moved and GEMM shapes per micro-batch.

The compute models price these operators (a roofline here; shape-aware efficiencies in
:mod:`mindpipe.simulator.perf`). Counting follows Megatron-LM's GPT layer (Narayanan et al., SC'21, §5.1;
Korthikanti et al. 2022, §4) on one tensor-parallel rank: QKV and projection GEMMs, attention
scores Q·Kᵀ, softmax, attention over values, MLP GEMMs, LayerNorms, GeLU, dropouts and residual
adds; the embedding; the LM head and the cross-entropy. A forward GEMM ``[M,K]×[K,N]`` costs
2·M·N·K FLOPs; its backward costs the same again for the input gradient (I) and for the weight
gradient (W), the split zero-bubble schedules rely on (Qi et al., ICLR'24).

Bytes are what each operator reads and writes in device memory, assuming no fusion beyond what
Megatron does by default (fused bias+GeLU, fused softmax); they drive the memory-bound side of the
roofline. A Llama block's RMSNorms, rotary embedding and SwiGLU are either one fused kernel each
(a plan's ``fused_elementwise``: Megatron-core, Transformer Engine) or, by default, the eager
PyTorch kernels the executor runs (:func:`rms_norm_ops`, :func:`rope_ops`, :func:`swiglu_ops`).
Each :class:`Op` stands for one GPU kernel, so the operator count of a phase is also its
kernel count (what per-kernel launch and host-dispatch overheads are charged on).

With ``flash_attention=True`` the attention core (Q·Kᵀ, mask, softmax, dropout, ·V) is one fused
kernel per direction (FlashAttention-2, Dao 2023): causal, so half the s² work is skipped, and the
backward recomputes the scores (2.5× the forward FLOPs: five s²-sized matmuls against two).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from mindpipe.traces.config import Model
from mindpipe.traces.flops import forward_flops_per_token, model_flops_per_iteration  # MFU's numerator, re-exported

PHASES = ("forward", "backward_input", "backward_weight")


@dataclass(frozen=True, slots=True)
class Op:
    """One operator of one layer for one micro-batch on one tensor-parallel rank.

    Attributes:
        name: Operator name (``qkv``, ``attn_scores``, ``softmax``, ``mlp_fc1`` …).
        phase: ``forward``, ``backward_input`` or ``backward_weight``.
        kind: ``gemm`` (dense matmul; ``gemm_mnk`` set), ``bmm`` (batched attention matmul;
            ``gemm_mnk`` and ``batch`` set), ``flash`` (fused attention kernel) or ``memory``
            (element-wise, norm, softmax, gather, reduction).
        flops: Floating-point operations.
        bytes: Device-memory traffic (reads + writes).
        gemm_mnk: ``(M, N, K)`` of a GEMM, else None.
        batch: Batch count of a batched GEMM (1 otherwise).
        attention_core: True for the ops selective recompute re-runs (Q·Kᵀ, softmax, dropout, ·V;
            Korthikanti et al. §5).
        out_bytes: Bytes of the result tensor the operator allocates (part of ``bytes``). On CPUs a
            large result is fresh memory from the kernel, paid per byte on first touch
            (:mod:`mindpipe.simulator.calibrate.models`).
        inner: A kernel issued inside the same autograd function as the operator's previous one
            (the eager RMSNorm's and rotary embedding's kernels after each direction's first):
            one ATen call with no autograd node or module of its own, so the per-operator host
            overhead a CPU calibration fits (on operators that each are one) is not charged again.
            A GPU still launches it (its per-kernel overhead stays).
    """

    name: str
    phase: str
    kind: str
    flops: float
    bytes: float
    gemm_mnk: tuple[int, int, int] | None = None
    batch: int = 1
    attention_core: bool = False
    out_bytes: float = 0.0
    inner: bool = False


def _gemm(name: str, m: int, n: int, k: int, dtype_bytes: int, batch: int = 1, core: bool = False) -> list[Op]:
    """Forward, input-gradient and weight-gradient ops of ``Y[m,n] = X[m,k] · W[k,n]``.

    For a batched matmul (attention) both operands are activations, so both backward products
    are input gradients (there is no weight); they are listed under ``backward_input``.
    """
    kind = "bmm" if batch > 1 or core else "gemm"
    f = 2.0 * m * n * k * batch
    d = dtype_bytes
    fwd = Op(name, "forward", kind, f, d * batch * (m * k + k * n + m * n), (m, n, k), batch, core, d * batch * m * n)
    # dX[m,k] = dY[m,n] · Wᵀ[n,k]
    dx = Op(name, "backward_input", kind, f, d * batch * (m * n + n * k + m * k), (m, k, n), batch, core, d * batch * m * k)
    # dW[k,n] = Xᵀ[k,m] · dY[m,n]
    dw_phase = "backward_input" if kind == "bmm" else "backward_weight"
    dw = Op(name + ("_dw" if kind == "gemm" else "_d2"), dw_phase, kind, f, d * batch * (k * m + m * n + k * n), (k, n, m), batch, core,
            d * batch * k * n)
    return [fwd, dx, dw]


def _mem(name: str, elems: float, reads: float, writes: float, dtype_bytes: int, core: bool = False,
         bwd_factor: float = 2.0) -> list[Op]:
    """A memory-bound op touching ``elems`` elements (reads/writes per element); backward ~2×."""
    fwd_bytes = elems * (reads + writes) * dtype_bytes
    out = elems * writes * dtype_bytes
    return [
        Op(name, "forward", "memory", 0.0, fwd_bytes, attention_core=core, out_bytes=out),
        Op(name, "backward_input", "memory", 0.0, bwd_factor * fwd_bytes, attention_core=core, out_bytes=out),
    ]


# One kernel of an operator run kernel by kernel: (name, bytes read, bytes written) per element.
_Kernel = tuple[str, float, float]


def _kernel_table(phase: str, elems: float, kernels: Sequence[_Kernel], prefix: str = "", suffix: str = "",
                  core: bool = False) -> list[Op]:
    """One memory-bound Op per kernel of ``kernels`` over ``elems`` elements in ``phase``, named
    ``prefix + name + suffix`` (the unfused softmax, the cross-entropy, Llama's eager operators)."""
    return [Op(f"{prefix}{k}{suffix}", phase, "memory", 0.0, elems * (r + w), attention_core=core, out_bytes=elems * w)
            for k, r, w in kernels]


def _flash(b: int, heads: int, s: int, hd: int, d: int, cp: int = 1, cp_comm_type: str = "allgather") -> list[Op]:
    """FlashAttention-2 forward and backward kernels (causal) for ``b·heads`` heads of width ``hd``.

    Under context parallelism (``cp`` > 1) ``s`` is one rank's s/cp queries, attending over the
    whole sequence's cp·s keys. ``p2p`` (Transformer Engine's ``AttnFuncWithCPAndKVP2P``; the
    executor's :class:`mindpipe.traces.torch_context_parallel._RingAttention`): cp kernels per
    direction, one per step of the K/V ring, which skip the causally masked chunks;
    with Megatron-core's balanced chunks every rank does 1/cp of the causal work, s·cp·s/2
    query-key pairs. ``allgather`` (the executor,
    :func:`mindpipe.traces.torch_context_parallel._attend`): one kernel per query chunk (s/2
    queries, chunk c) over the keys of chunks 0..c under a mask of the tokens' global positions; a
    masked kernel computes every pair it is given, so the rank's two chunks cost (2·cp + 1)·s²/4
    pairs, whichever rank it is (the ring: cp·s²/2); in the backward those kernels' forward again
    (only q, k and v are kept) before their backward.
    """
    qkv_o = b * heads * s * hd * d
    lse = 4 * b * heads * s
    if cp > 1 and cp_comm_type == "allgather":
        pairs = (2 * cp + 1) * s * s / 4
        flops = 4.0 * b * heads * pairs * hd / 2  # per kernel: the two chunks' kernels together cost ``pairs``
        # Per kernel: reads its Q chunk and the K/V prefix, writes O; the backward also reads O and
        # dO and writes dQ, dK, dV. The two prefixes hold (2·cp + 1)·s/2 keys.
        io = (qkv_o + qkv_o * (2 * cp + 1) / 2) / 2 + lse / 2
        fwd = Op("flash_attn", "forward", "flash", flops, io, attention_core=True)
        again = Op("flash_attn_rerun", "backward_input", "flash", flops, io, attention_core=True)
        bwd = Op("flash_attn", "backward_input", "flash", 2.5 * flops, 2 * io, attention_core=True)
        return [fwd, fwd, again, again, bwd, bwd]
    fwd_flops = 0.5 * 4.0 * b * heads * s * (s * cp) * hd  # QKᵀ and PV, half the blocks skipped (causal)
    # Reads Q, K, V; writes O and the fp32 log-sum-exp per row. Backward: reads Q, K, V, O, dO and
    # the log-sum-exp; writes dQ, dK, dV. Per ring step: a K/V chunk of s rows.
    fwd = Op("flash_attn", "forward", "flash", fwd_flops / cp, 4 * qkv_o + lse, attention_core=True)
    bwd = Op("flash_attn", "backward_input", "flash", 2.5 * fwd_flops / cp, 8 * qkv_o + lse, attention_core=True)
    return [fwd] * cp + [bwd] * cp


gemm_ops = _gemm
"""Public name of :func:`_gemm`: the F, I and W operators of one GEMM (the supernet's candidate costs build on it)."""
memory_ops = _mem
"""Public name of :func:`_mem`: a memory-bound operator and its backward."""


def block_ops(model: Model, micro_batch_size: int, seq_len: int, tp: int = 1, sequence_parallel: bool = False,
              dtype_bytes: int = 2, flash_attention: bool = False, cp: int = 1,
              cp_comm_type: str = "allgather", fused_elementwise: bool = False) -> list[Op]:
    """Operators of one transformer block on one TP rank (Megatron column/row-parallel layout).

    GPT: LayerNorm, fused QKV, attention core, projection, residual, LayerNorm, fc1, GeLU, fc2,
    residual. Llama (:func:`_llama_block_ops`): RMSNorm, Q, K, V (K and V of width kv·h/a under
    grouped-query attention), rotary embedding on Q and K, attention core, output projection,
    residual, RMSNorm, SwiGLU's gate and up GEMMs, the gated activation, down, residual.

    Args:
        model: The model contract.
        micro_batch_size: Sequences per micro-batch (b).
        seq_len: Tokens per sequence (s).
        tp: Tensor-parallel degree t: QKV/fc1 are column-split, projection/fc2 row-split, heads split.
        sequence_parallel: LayerNorm, dropout and residual run on s/t tokens (Korthikanti §4.2.2).
        dtype_bytes: Bytes per activation/weight element.
        flash_attention: Price the attention core as one fused kernel per direction instead of
            Megatron's baddbmm + fused softmax + dropout + bmm (the default, as in vTrain's runs).
        cp: Context-parallel degree: ``seq_len`` is then one rank's s/cp tokens, and the fused
            attention core attends over all cp·seq_len keys (:func:`_flash`; cp > 1 needs
            ``flash_attention``, as the plan contract says).
        cp_comm_type: How K and V reach every cp rank (``allgather`` or ``p2p``), which sets how
            the core is computed (:func:`_flash`).
        fused_elementwise: Price a Llama block's RMSNorms, rotary embedding and SwiGLU activation
            as one fused kernel each (Megatron-core, Transformer Engine) instead of the executor's
            PyTorch kernels one by one (a plan's ``fused_elementwise``). GPT's block is the same
            either way: its LayerNorm and GeLU are one PyTorch kernel each too.
    """
    if cp > 1 and not flash_attention:
        raise ValueError("context parallelism (cp > 1) is priced for the fused attention kernel only")
    if model.is_llama:
        return _llama_block_ops(model, micro_batch_size, seq_len, tp, sequence_parallel, dtype_bytes, flash_attention,
                                cp, cp_comm_type, fused_elementwise)
    b, s, h, f = micro_batch_size, seq_len, model.hidden_size, model.ffn
    t = tp
    tokens = b * s
    local_tokens = tokens // t if sequence_parallel else tokens
    d = dtype_bytes
    ops: list[Op] = []
    ops += _mem("ln1", local_tokens * h, 1, 1, d)
    ops += _gemm("qkv", tokens, 3 * h // t, h, d)
    ops += _attention_core(model, b, s, t, d, flash_attention, cp, cp_comm_type)
    ops += _gemm("proj", tokens, h, h // t, d)
    ops += _mem("residual1", local_tokens * h, 2 + (1 if model.dropout else 0), 1, d, bwd_factor=1.0)
    ops += _mem("ln2", local_tokens * h, 1, 1, d)
    ops += _gemm("mlp_fc1", tokens, f // t, h, d)
    ops += _mem("gelu", tokens * f // t, 1, 1, d)
    ops += _gemm("mlp_fc2", tokens, h, f // t, d)
    ops += _mem("residual2", local_tokens * h, 2 + (1 if model.dropout else 0), 1, d, bwd_factor=1.0)
    return ops


def _attention_core(model: Model, b: int, s: int, t: int, d: int, flash_attention: bool, cp: int = 1,
                    cp_comm_type: str = "allgather") -> list[Op]:
    """Q·Kᵀ, mask + softmax, dropout, ·V for the a/t local query heads (GQA changes none of it:
    every query head attends over its K/V head's s keys)."""
    hd, heads = model.head_dim, model.num_heads // t
    if flash_attention:
        return _flash(b, heads, s, hd, d, cp, cp_comm_type)
    scores = float(b * heads * s * s)
    ops = _gemm("attn_scores", s, s, hd, d, batch=b * heads, core=True)
    if d != 2 or fused_softmax_available(b, heads, s, s):
        # Fused scale + causal mask + softmax: read scores, write probabilities; backward reads
        # the probabilities and their gradient and writes the scores' gradient.
        ops += [Op("softmax", "forward", "memory", 0.0, scores * 2 * d, attention_core=True, out_bytes=scores * d),
                Op("softmax", "backward_input", "memory", 0.0, scores * 3 * d, attention_core=True, out_bytes=scores * d)]
    else:
        ops += _unfused_softmax(scores, d)
    if model.dropout:
        # native_dropout: read x, write y and a 1-byte mask; backward: read grad and mask, write.
        ops += [Op("attn_dropout", "forward", "memory", 0.0, scores * (2 * d + 1), attention_core=True, out_bytes=scores * (d + 1)),
                Op("attn_dropout", "backward_input", "memory", 0.0, scores * (2 * d + 1), attention_core=True, out_bytes=scores * d)]
    ops += _gemm("attn_context", s, hd, s, d, batch=b * heads, core=True)
    return ops


# Megatron's fused causal softmax kernel handles key lengths in (16, 4096] (Megatron-DeepSpeed's
# older copy: (16, 2048]; vTrain's rows, s ≤ 2048, meet both) and whole blocks of attention batches.
_FUSED_SOFTMAX_MAX_KEYS = 4096


def fused_softmax_available(b: int, heads: int, sq: int, sk: int) -> bool:
    """Whether Megatron runs its fused scale + mask + softmax kernel on 16-bit attention scores.

    ``FusedScaleMaskSoftmax`` (Megatron-LM ``megatron/core/fusions/fused_softmax.py``
    ``is_kernel_available``; Megatron-DeepSpeed ``megatron/model/fused_softmax.py`` ``forward``)
    uses the CUDA kernel only when ``16 < sk ≤ 4096``, ``sq % 4 == 0`` and the attention batch
    ``b · heads`` (sequences × local heads) is a multiple of the kernel's batches per CTA — 4 for
    ``sk > 128``, 8 below (``get_batch_per_block`` in ``scaled_masked_softmax.h``: 128 threads, one
    warp per row of up to 32·k keys, two rows per warp up to 128 keys). Otherwise it falls back to
    PyTorch ops (:func:`_unfused_softmax`). E.g. 16 heads at tp 8 (2 local heads) and micro-batch 1:
    ``b · heads = 2`` — the fallback.
    """
    per_block = 8 if sk <= 128 else 4
    return 16 < sk <= _FUSED_SOFTMAX_MAX_KEYS and sq % 4 == 0 and (b * heads) % per_block == 0


def _unfused_softmax(scores: float, d: int) -> list[Op]:
    """Megatron's fallback when the fused kernel is unavailable (:func:`fused_softmax_available`),
    kernel by kernel over ``scores`` elements of ``d``-byte (16-bit) scores, softmax in fp32 (forced
    on with query-key layer scaling, Megatron's fp16 default): forward ``input.float()`` (read d,
    write 4), ``* scale`` (4+4), ``masked_fill_`` with the causal mask (4+4), ``Softmax`` (4+4),
    ``.half()`` (4+d); autograd's backward runs the same five in reverse: cast the gradient up
    (d+4), softmax backward (read output and gradient, write: 12), masked fill (4+4), scale (4+4),
    cast down (4+d)."""
    fwd: list[_Kernel] = [("softmax_cast", d, 4), ("softmax_scale", 4, 4), ("softmax_mask", 4, 4), ("softmax", 4, 4),
                          ("softmax_cast_back", 4, d)]
    bwd: list[_Kernel] = [("softmax_cast_back", d, 4), ("softmax", 8, 4), ("softmax_mask", 4, 4), ("softmax_scale", 4, 4),
                          ("softmax_cast", 4, d)]
    return _kernel_table("forward", scores, fwd, core=True) + _kernel_table("backward_input", scores, bwd, core=True)


def _llama_block_ops(model: Model, b: int, s: int, t: int, sp: bool, d: int, flash_attention: bool,
                     cp: int = 1, cp_comm_type: str = "allgather", fused_elementwise: bool = False) -> list[Op]:
    """A Llama block's operators on one TP rank (see :func:`block_ops`).

    Q, K, V are three GEMMs as in :mod:`mindpipe.traces.torch_llama` (column-parallel, K/V heads
    split over t). The RMSNorms, the rotary embedding of Q and K and the SwiGLU activation are
    :func:`rms_norm_ops`, :func:`rope_ops` and :func:`swiglu_ops`: one fused kernel each with
    ``fused_elementwise``, else the executor's PyTorch kernels one by one. The ``residual1`` name
    marks the attention part's end (:mod:`mindpipe.simulator.block_parts`).
    """
    h, f, kv = model.hidden_size, model.ffn, model.kv_width
    tokens = b * s
    local_tokens = tokens // t if sp else tokens
    ops: list[Op] = []
    ops += rms_norm_ops("ln1", local_tokens, h, d, fused_elementwise)
    ops += _gemm("q", tokens, h // t, h, d)
    ops += _gemm("k", tokens, kv // t, h, d)
    ops += _gemm("v", tokens, kv // t, h, d)
    ops += rope_ops(tokens * h // t, tokens * kv // t, d, fused_elementwise)
    ops += _attention_core(model, b, s, t, d, flash_attention, cp, cp_comm_type)
    ops += _gemm("proj", tokens, h, h // t, d)
    ops += _mem("residual1", local_tokens * h, 2, 1, d, bwd_factor=1.0)
    ops += rms_norm_ops("ln2", local_tokens, h, d, fused_elementwise)
    ops += _gemm("mlp_gate", tokens, f // t, h, d)
    ops += _gemm("mlp_up", tokens, f // t, h, d)
    ops += swiglu_ops(tokens * f // t, d, fused_elementwise)
    ops += _gemm("mlp_down", tokens, h, f // t, d)
    ops += _mem("residual2", local_tokens * h, 2, 1, d, bwd_factor=1.0)
    return ops


# -- Llama's element-wise operators, fused or as PyTorch eager runs them -----------------------
# Fused (``Plan.fused_elementwise``): one kernel per operator and direction, as Megatron-core and
# Transformer Engine run them (NeMo's recipes; Apex's fused RMSNorm). Eager (the executor, and
# torchtitan without torch.compile): every PyTorch kernel of the executor's code
# (:mod:`mindpipe.traces.torch_llama`), each reading and writing its whole tensor (a :data:`_Kernel`
# per element of the operator's tensor).


def _kernel_ops(name: str, elems: float, forward: Sequence[_Kernel], backward: Sequence[_Kernel],
                rows: float = 0.0, row_kernels: int = 0, one_function: bool = False) -> list[Op]:
    """One memory-bound Op per kernel, over ``elems`` elements; ``row_kernels`` more per direction
    act on one value per row (``rows`` of them: a norm's per-token statistic), 4 bytes each way.
    ``one_function``: each direction's kernels run inside one autograd function, so all but its
    first are :attr:`Op.inner`."""
    fwd = _kernel_table("forward", elems, forward, prefix=f"{name}.")
    fwd += _kernel_table("forward", rows, [(f"row{i}", 4.0, 4.0) for i in range(row_kernels)], prefix=f"{name}.")
    bwd = _kernel_table("backward_input", elems, backward, prefix=f"{name}.")
    if one_function:
        fwd = fwd[:1] + [dataclasses.replace(o, inner=True) for o in fwd[1:]]
        bwd = bwd[:1] + [dataclasses.replace(o, inner=True) for o in bwd[1:]]
    return fwd + bwd


def rms_norm_ops(name: str, tokens: int, width: int, d: int, fused: bool) -> list[Op]:
    """RMSNorm over ``tokens`` rows of ``width`` in a ``d``-byte dtype.

    Fused: read x, write y; the backward reads x and the gradient and writes dx (twice the
    forward's bytes, as every memory op here). Eager
    (:class:`mindpipe.traces.torch_llama._RMSNormFunction`, statistics in fp32, s = 4 bytes):
    forward ``x.to(fp32)`` (d + s), ``pow(2)`` (2s), ``mean`` (s), then ``+ eps`` and ``rsqrt``
    on one value per token, ``xf · rstd`` (2s), ``.to(dtype)`` (s + d), ``· weight`` (2d);
    backward ``x.to`` (d + s), ``· rstd`` (2s), ``grad.to`` (d + s), ``grad · w`` (2s), ``gw · x̂``
    (3s), ``mean`` (s), ``x̂ · mean`` (2s), subtract (3s), ``rstd ·`` (2s), ``grad.to`` again
    (d + s), ``· x̂`` (3s), the weight gradient's column sum (s), ``dx.to`` (s + d). In fp32 the
    casts are no kernels at all. 16-bit: 36 bytes per element forward and 100 backward, against 4
    and 8 fused.
    """
    elems = float(tokens) * width
    if fused:
        return _mem(name, elems, 1, 1, d)
    st = 4
    cast = d != st
    fwd: list[_Kernel] = [("cast", d, st)] if cast else []
    fwd += [("pow", st, st), ("mean", st, 0.0), ("scale", st, st)]
    fwd += [("cast_back", st, d)] if cast else []
    fwd += [("weight", d, d)]
    bwd: list[_Kernel] = [("cast", d, st)] if cast else []
    bwd += [("xhat", st, st)] + ([("grad_cast", d, st)] if cast else [])
    bwd += [("grad_weight", st, st), ("dot", 2 * st, st), ("mean", st, 0.0), ("proj", st, st), ("sub", 2 * st, st),
            ("rstd", st, st)]
    bwd += [("grad_cast2", d, st)] if cast else []
    bwd += [("dweight_mul", 2 * st, st), ("dweight_sum", st, 0.0)]
    bwd += [("dx_cast", st, d)] if cast else []
    return _kernel_ops(name, elems, fwd, bwd, rows=float(tokens), row_kernels=2, one_function=True)


def rope_ops(q_elems: int, k_elems: int, d: int, fused: bool) -> list[Op]:
    """The rotary embedding of Q and K (``q_elems`` and ``k_elems`` elements on the rank).

    Fused: one pass over both, reading x and its rotated half and writing the result (the cos/sin
    tables are small). Eager (:class:`mindpipe.traces.torch_llama._RotaryFunction`, per tensor):
    forward ``x · cos`` (2d), ``−x₂`` on half (d), ``cat`` (2d), ``addcmul`` (3d); backward
    ``g · cos`` (2d), ``−g₁`` (d), ``cat`` (2d), ``· sin`` (2d), add (3d). The tables themselves
    (s × head_dim, made in each direction) are left out.
    """
    if fused:
        return _mem("rope", q_elems + k_elems, 2, 1, d)
    fwd: list[_Kernel] = [("cos", d, d), ("neg", 0.5 * d, 0.5 * d), ("cat", d, d), ("addcmul", 2 * d, d)]
    bwd: list[_Kernel] = [("cos", d, d), ("neg", 0.5 * d, 0.5 * d), ("cat", d, d), ("sin", d, d), ("add", 2 * d, d)]
    # Q's and K's kernels run inside one autograd function per direction (_RotaryFunction).
    q, k = _kernel_ops("rope_q", q_elems, fwd, bwd, one_function=True), _kernel_ops("rope_k", k_elems, fwd, bwd)
    return [*q, *[dataclasses.replace(o, inner=True) for o in k]]


def swiglu_ops(elems: int, d: int, fused: bool) -> list[Op]:
    """SwiGLU's gated activation ``silu(gate) · up`` over ``elems`` elements.

    Fused: read gate and up, write the product; backward twice that. Eager (``F.silu(gate) · up``
    under autograd): forward ``silu`` (2d), multiply (3d); backward the product's two gradients
    (3d each) and ``silu``'s (3d).
    """
    if fused:
        return _mem("swiglu", elems, 2, 1, d)
    fwd: list[_Kernel] = [("silu", d, d), ("mul", 2 * d, d)]
    bwd: list[_Kernel] = [("grad_silu", 2 * d, d), ("grad_up", 2 * d, d), ("silu", 2 * d, d)]
    return _kernel_ops("swiglu", elems, fwd, bwd)


def embedding_ops(model: Model, micro_batch_size: int, seq_len: int, tp: int = 1, dtype_bytes: int = 2) -> list[Op]:
    """Token (+ position, for GPT) embedding (vocabulary-parallel gather) on one TP rank.

    The weight gradient is dense: ``embedding_dense_backward`` zero-fills a [V/t, h] table,
    scatter-adds the output gradient into the looked-up rows, and the result is accumulated into
    the parameter's gradient (read both, write one) — so it costs table-sized traffic, not just
    token-sized (PyTorch ``aten/src/ATen/native/cuda/Embedding.cu``).
    """
    tokens = micro_batch_size * seq_len
    h, d = model.hidden_size, dtype_bytes
    table = -(-model.vocab_size // tp) * h * d
    reads = 1.0 if model.is_llama else 2.0  # token rows (and position rows)
    return [
        Op("embedding", "forward", "memory", 0.0, (reads + 1.0) * tokens * h * d, out_bytes=tokens * h * d),
        Op("embedding_dw_zero", "backward_weight", "memory", 0.0, float(table), out_bytes=float(table)),
        Op("embedding_dw", "backward_weight", "memory", 0.0, 3.0 * tokens * h * d),
        Op("embedding_dw_accum", "backward_weight", "memory", 0.0, 3.0 * table),
    ]


def final_norm_ops(model: Model, micro_batch_size: int, seq_len: int, tp: int = 1, sequence_parallel: bool = False,
                   dtype_bytes: int = 2, fused_elementwise: bool = False) -> list[Op]:
    """The final LayerNorm (RMSNorm for Llama, :func:`rms_norm_ops`) before the LM head."""
    tokens = micro_batch_size * seq_len
    local = tokens // tp if sequence_parallel else tokens
    if model.is_llama:
        return rms_norm_ops("final_norm", local, model.hidden_size, dtype_bytes, fused_elementwise)
    return _mem("final_norm", local * model.hidden_size, 1, 1, dtype_bytes)


def lm_head_ops(model: Model, micro_batch_size: int, seq_len: int, tp: int = 1, dtype_bytes: int = 2,
                loss_chunks: int = 1, fused: bool = False) -> list[Op]:
    """Vocabulary-parallel LM head GEMM and the cross-entropy over the logits (fp32 softmax);
    with ``loss_chunks`` > 1 the cross-entropy of :func:`chunked_cross_entropy_ops`; ``fused``
    (a plan's ``fused_head_loss``) the head and the loss together piece by piece
    (:func:`fused_head_loss_ops`)."""
    tokens = micro_batch_size * seq_len
    v_local = -(-model.vocab_size // tp)
    if fused:
        return fused_head_loss_ops(tokens, v_local, model.hidden_size, loss_chunks, dtype_bytes)
    ops = _gemm("lm_head", tokens, v_local, model.hidden_size, dtype_bytes)
    if loss_chunks > 1:
        return ops + chunked_cross_entropy_ops(tokens, v_local, loss_chunks, dtype_bytes)
    return ops + cross_entropy_ops(tokens, v_local, dtype_bytes)


def chunked_cross_entropy_ops(tokens: int, v_local: int, chunks: int, dtype_bytes: int = 2) -> list[Op]:
    """The cross-entropy of a plan with ``loss_chunks`` = ``chunks`` > 1, kernel by kernel.

    The tokens go in ``chunks`` pieces (:func:`mindpipe.traces.torch_gpt.lm_loss`); each piece runs
    :func:`cross_entropy_ops`'s forward kernels, and in the backward the same forward kernels again
    (the piece's fp32 log-softmax is not kept) before its backward kernels. So the bytes moved
    grow by one forward pass and the kernel count by ``chunks`` times; the FLOPs stay zero.
    """
    out: list[Op] = []
    for piece in (tokens // chunks + (1 if k < tokens % chunks else 0) for k in range(chunks)):
        ops = cross_entropy_ops(piece, v_local, dtype_bytes)
        rerun = [Op(o.name + "_rerun", "backward_input", o.kind, o.flops, o.bytes, out_bytes=o.out_bytes)
                 for o in ops if o.phase == "forward"]
        out += [o for o in ops if o.phase == "forward"] + rerun + [o for o in ops if o.phase != "forward"]
    return out


def fused_head_loss_ops(tokens: int, v_local: int, hidden: int, chunks: int, dtype_bytes: int = 2) -> list[Op]:
    """The LM head and the cross-entropy fused over ``chunks`` pieces of tokens, kernel by kernel
    (:class:`mindpipe.traces.torch_head_loss.LinearCrossEntropy`).

    Per piece of n tokens: the forward is the head's ``[n, h]×[h, V]`` GEMM and
    :func:`cross_entropy_ops`'s forward kernels; the backward runs both again — the logits are not
    kept — then the loss's backward kernels, the head's input gradient and its weight gradient,
    one ``[h, n]×[n, V]`` GEMM per piece accumulated in place. All of it is one pass (the
    input-gradient phase): the weight gradient needs each piece's logit gradient, which is not
    kept, so a split backward's W has nothing of the head left to do. Against the unfused head:
    one more head GEMM and one more pass of the loss's forward kernels per micro-batch, and GEMMs
    of n = tokens/chunks rows.
    """
    out: list[Op] = []
    for piece in (tokens // chunks + (1 if k < tokens % chunks else 0) for k in range(chunks)):
        ops = _gemm("lm_head", piece, v_local, hidden, dtype_bytes) + cross_entropy_ops(piece, v_local, dtype_bytes)
        forward = [o for o in ops if o.phase == "forward"]
        rerun = [Op(o.name + "_rerun", "backward_input", o.kind, o.flops, o.bytes, o.gemm_mnk, o.batch,
                    out_bytes=o.out_bytes) for o in forward]
        backward = [dataclasses.replace(o, phase="backward_input") for o in ops if o.phase != "forward"]
        out += forward + rerun + backward
    return out


def cross_entropy_ops(tokens: int, v_local: int, dtype_bytes: int = 2) -> list[Op]:
    """Megatron's vocabulary-parallel cross-entropy over fp32 logits, kernel by kernel.

    ``vocab_parallel_cross_entropy(logits.float(), labels)`` (Megatron-LM
    ``core/tensor_parallel/cross_entropy.py``): forward = cast to fp32, row max, subtract, exp,
    row sum (the all-reduces of max and sum are tiny); backward = divide by the sum (softmax),
    scale by the incoming gradient (the one-hot subtraction touches one element per row), cast
    back. Bytes per logit: forward 2+4, 4, 4+4, 4+4, 4; backward 4+4, 4+4, 4+dtype; of those, the
    kernels that write a whole logits-sized result (cast, subtract, exp; softmax, scale, cast
    back) allocate it.
    """
    e = float(tokens) * v_local
    fwd: list[_Kernel] = [("ce_cast", dtype_bytes, 4), ("ce_max", 4, 0), ("ce_sub", 4, 4), ("ce_exp", 4, 4), ("ce_sum", 4, 0)]
    bwd: list[_Kernel] = [("ce_softmax", 4, 4), ("ce_grad", 4, 4), ("ce_cast", 4, dtype_bytes)]
    return _kernel_table("forward", e, fwd) + _kernel_table("backward_input", e, bwd, suffix="_bwd")


__all__ = [
    "PHASES",
    "Op",
    "block_ops",
    "chunked_cross_entropy_ops",
    "cross_entropy_ops",
    "embedding_ops",
    "final_norm_ops",
    "forward_flops_per_token",
    "fused_head_loss_ops",
    "fused_softmax_available",
    "gemm_ops",
    "lm_head_ops",
    "memory_ops",
    "model_flops_per_iteration",
    "rms_norm_ops",
    "rope_ops",
    "swiglu_ops",
]
