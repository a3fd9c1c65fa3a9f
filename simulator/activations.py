"""What one transformer block keeps for its backward, per micro-batch and tensor-parallel rank
(the memory model's activation terms, :mod:`mindpipe.simulator.memory`).

Activations follow Korthikanti et al. (2022, arXiv 2205.05198, §4 and Table 2; BACKGROUND.md §2),
written per element size so one formula covers every precision. Per transformer layer and one
micro-batch on one tensor-parallel rank, with ``d``-byte activations, ``k``-byte dropout masks,
``f`` the MLP width and ``t`` the TP degree:

* kept whole by every TP rank (unless sequence parallelism shards it): the two LayerNorm inputs
  (2d), the QKV input (d), the MLP input (d) and the two residual-dropout masks (2k), ``4d + 2k``
  per s·b·h (Korthikanti's 10);
* split over t: Q, K, V and the projection input (4d), the GeLU and fc2 inputs (2d·f/h), per
  s·b·h (Korthikanti's 8 + 16 = 24 at f = 4h; Megatron's ``theoretical_memory_usage`` writes
  the whole as 18 + 4·f/h);
* split over t, per a·s²·b: softmax output (d), attention-dropout mask (k), dropout output (d),
  ``2d + k`` (Korthikanti's 5).

At d = 2, k = 1, f = 4h these give exactly s·b·h·(10 + 24/t + 5·a·s/(h·t)), and with sequence
parallelism the whole divided by t. Selective recompute drops the a·s²·b term; full recompute
keeps the layer input, d·s·b·h (÷t when sequence-sharded, as Megatron checkpoints it).

Decisions:

* Dropout masks follow the **model**: with ``model.dropout == 0`` neither Megatron nor our torch
  GPT keeps masks, and the attention term shrinks to the softmax output alone (d; ``probs @ V``
  saves it). The paper's setting (GPT-3 dropout 0.1) reproduces its numbers exactly.
* Masks are 1 byte on GPUs (CUDA ``native_dropout`` keeps a bool mask) and ``d`` bytes on CPUs
  (torch's CPU path keeps the scaled noise, :func:`mindpipe.traces.torch_gpt.dropout_mask_bytes`).
* fp32 is the same accounting with d = 4 (masks stay 1 byte on GPUs).
* A block cut by a stage boundary (``Plan.stage_cuts``, :mod:`mindpipe.traces.layout`) keeps,
  per part, what its operators save: the attention part LN1 input, QKV input, Q, K, V, the
  projection input, its residual-dropout mask and the a·s²·b term; the MLP part LN2 input, fc1
  input, GeLU and fc2 inputs and its residual-dropout mask (the two sum to the whole block). Under
  full recompute each part keeps its own input, d·s·b·h; its parameters are
  :func:`mindpipe.simulator.block_parts.part_params`.
* Per-token LayerNorm statistics (mean, rstd: 4·d·s·b per block) are left out, as the paper
  does; they are 1/h of the rest. ``traces.torch_gpt.block_activation_bytes`` counts them.

FlashAttention (the plan's ``flash_attention``: one owner decides how a run's attention is
computed, and the time model, the memory model and the executor all follow it) never materialises the
a·s²·b scores: its backward recomputes them block by block from Q, K, V, the output and the
softmax statistics, one fp32 log-sum-exp per query row and head (Dao 2023, "FlashAttention-2",
arXiv 2307.08691, Algorithm 1 saves L; Algorithm 2 reads it), and it regenerates the dropout mask
from the RNG state. So under it the a·s²·b term becomes ``4·a·s·b`` bytes (split over t), and
selective recompute drops that too. Q, K, V and the output (the projection input) are kept as
before.

Plan precision ``fp8`` (FP8 block GEMMs, bf16 elsewhere; :mod:`mindpipe.simulator.perf.fp8`) keeps
d = 2 for every tensor but the saved inputs of the blocks' GEMMs — QKV, projection, fc1 and fc2 (or
gate/up and down) — which Transformer Engine saves as their FP8 casts, 1 byte (GEMM_INPUT_BYTES); so a
GPT layer without dropout keeps 25·s·b·h instead of 32·s·b·h (plus the a·s²·b term). Its model
states are bf16 mixed precision's plus the FP8 weight copy and transpose (FP8_WEIGHT_CACHE_BYTES).

Llama blocks (``kind: "llama"``, :mod:`mindpipe.traces.torch_llama`) follow the same accounting
term by term, with r = num_kv_heads/num_heads and no dropout (k = 0):

* kept whole: RMSNorm-1 input (d), Q/K/V input (d), RMSNorm-2 input (d), gate/up input (d):
  ``4d`` per s·b·h, as GPT's without masks (an RMSNorm keeps its input like a LayerNorm);
* split over t, attention: Q (d), K and V (r·d each: grouped-query attention shrinks them; the
  rotary embedding keeps nothing: its backward re-makes the cos/sin tables), output-projection input (d) → ``(2 + 2r)·d``
  (GPT's 4d at r = 1);
* split over t, MLP: SwiGLU keeps four f-wide tensors, the gate output (SiLU's input), the SiLU
  output and the up output (the product's factors) and the down input → ``4d·f/h`` (GeLU: 2d·f/h;
  Megatron's fused bias-SwiGLU would keep 3);
* per a·s²·b, split over t: the softmax output (d).

So a Llama layer keeps s·b·h·d·(4 + 2 + 2r + 4f/h) + d·a·s²·b without parallelism; TP, sequence
parallelism, selective and full recompute divide and drop terms exactly as for GPT. The
per-token fp32 rstd of each RMSNorm (8·s·b per block) is left out like LayerNorm's statistics.

Under context parallelism (``plan.cp``) every s above is a rank's share, s/cp
(:meth:`mindpipe.traces.config.Plan.rank_seq_len`, which the cost model uses too); ``cp`` needs
FlashAttention, so the attention core keeps only its own queries' statistics.
"""

from __future__ import annotations

from mindpipe.simulator.costs import DTYPE_BYTES
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import BLOCK_POLICIES, BlockPart, BlockPolicy

# Bool dropout mask of CUDA's fused dropout (Korthikanti et al. §4.1 count 1 byte per element).
GPU_MASK_BYTES = 1
# Embedding backward needs the token ids: int64 (Megatron's calculator counts 8·s·b per micro-batch).
TOKEN_ID_BYTES = 8
# The saved inputs of the blocks' GEMMs under plan precision ``fp8``: their FP8 casts (Transformer
# Engine saves ``inputmat`` as Float8Tensor for the weight gradient), 1 byte per element.
GEMM_INPUT_BYTES = {"fp8": 1}
# FlashAttention's saved softmax statistics: one fp32 log-sum-exp per query row and head (module docstring).
FLASH_STAT_BYTES = 4


def _level(plan: Plan, policy: str | None) -> BlockPolicy:
    """The block policy ``policy`` names (:mod:`mindpipe.traces.layout`), or the plan's recompute level."""
    level = plan.recompute if policy is None else policy
    if level not in BLOCK_POLICIES:
        raise ContractError("plan", "layer_memory_policy", f"policy {level!r} is not one of {', '.join(BLOCK_POLICIES)}")
    return level  # type: ignore[return-value]


def _mask_bytes(model: Model, mask_bytes: int | None) -> int:
    """Bytes per dropout-mask element, 0 when the model has no dropout (nothing is kept)."""
    if model.dropout == 0:
        return 0
    return GPU_MASK_BYTES if mask_bytes is None else mask_bytes


def activation_bytes_per_layer(
    model: Model,
    plan: Plan,
    *,
    policy: BlockPolicy | None = None,
    seq_len: int | None = None,
    mask_bytes: int | None = None,
    part: BlockPart = "whole",
) -> float:
    """Bytes one transformer block (or one part of it) keeps for backward, one micro-batch, one TP rank.

    Args:
        model: The model (h, a, f, dropout).
        plan: Micro-batch size, TP degree, sequence parallelism, recompute level, precision.
        policy: The block's policy (:func:`mindpipe.traces.layout.block_policies`): ``none``,
            ``selective``, ``nongemm``, ``full`` or ``swap`` (0 on device; vPipe moves it to the host); None
            means the plan's recompute level.
        seq_len: Sequence length if not the model's.
        mask_bytes: Bytes per dropout-mask element (default 1, a GPU's bool mask).
        part: ``whole``, or the ``attention`` or ``mlp`` part of a block cut by a stage boundary
            (module docstring).

    Returns:
        Bytes (a float: shards of odd sizes are averaged over ranks).
    """
    level = _level(plan, policy)
    if level == "swap":
        return 0.0
    s, b, h, a = plan.rank_seq_len(seq_len or model.seq_len), plan.micro_batch_size, model.hidden_size, model.num_heads
    t, d, k = plan.tp, DTYPE_BYTES[plan.precision], _mask_bytes(model, mask_bytes)
    # A GEMM's saved input (QKV, projection, fc1/gate-up, fc2/down): its FP8 cast under fp8.
    g = GEMM_INPUT_BYTES.get(plan.precision, d)
    seq_shard = t if plan.sequence_parallel else 1
    sbh = s * b * h
    if level == "full":
        return d * sbh / seq_shard
    attention, mlp = part != "mlp", part != "attention"
    if level == "nongemm":
        return _nongemm_bytes(model, d, sbh, seq_shard, attention, mlp)
    # Per part: the norm's input (d), the first GEMM's input (g), the residual-dropout mask (k).
    replicated = (d + g + k) * sbh * (attention + mlp)
    kv_ratio = model.kv_heads / a
    # Q, K, V (d) and the projection input (g); the MLP's f-wide tensors: GeLU's input (d) and fc2's
    # input (g), or SwiGLU's gate output, SiLU output, up output (d) and down input (g) (module docstring).
    mlp_d = 3 if model.is_llama else 1
    split = (((1 + 2 * kv_ratio) * d + g) * attention + (mlp_d * d + g) * model.ffn / h * mlp) * sbh
    # Softmax output, dropout mask and dropout output; without dropout only the softmax output.
    # FlashAttention: one fp32 log-sum-exp per query row and head instead (module docstring).
    scores = (FLASH_STAT_BYTES * a * s * b if plan.flash_attention
              else (2 * d + k if model.dropout else d) * a * s * s * b) * attention
    out = replicated / seq_shard + split / t
    return out if level == "selective" else out + scores / t


def weight_pass_groups(model: Model, plan: Plan, *, seq_len: int | None = None,
                       part: BlockPart = "whole") -> list[tuple[float, float]]:
    """A block's (or part's) parameter groups under a split backward, in the order torch's W takes
    them (the block's parameters' order: GPT's LayerNorm, QKV, projection | LayerNorm, fc1, fc2;
    Llama's RMSNorm, wq, wk, wv, wo | RMSNorm, gate, up, down; :func:`mindpipe.traces.layout.weight_groups`
    counts them), one micro-batch, one TP rank: per group (kept, asked), bytes.

    * **kept**: the output gradient I keeps for the group until W's pass for it frees it — torch's
      ``stage_backward_input`` groups the parameters by the autograd node their gradient leaves the
      input path at and keeps that node's incoming gradient (``param_group["grads"]``). A norm's
      output, h per token (÷t under sequence parallelism); a column-parallel GEMM's output, ÷t
      (GPT's QKV 3h and fc1 f; Llama's wq, wk, wv (1 + 2r)·h, gate and up f each); a row-parallel
      GEMM's output, whole (h). GPT at f = 4h: 11·s·b·h·d per block, measured on gpt-mini and
      gpt-tiny-8k (23·s·b·h fp32 elements for two blocks and the final norm); Llama: (5 + 2r)·h + 2f
      per token, 12·s·b·h on llama-tiny. The same whatever the block's policy.
    * **asked**: the saved tensor the group's weight gradient unpacks, which a swapped block brings
      back then: a norm's input (h, ÷t under sequence parallelism), a column-parallel GEMM's input
      (h: gathered again under sequence parallelism), a row-parallel GEMM's input (h/t, or f/t).
      The attention core's tensors are I's alone (W walks no core).
    """
    s, b, h = plan.rank_seq_len(seq_len or model.seq_len), plan.micro_batch_size, model.hidden_size
    t, unit = plan.tp, DTYPE_BYTES[plan.precision] * s * b * h
    norm = 1 / (t if plan.sequence_parallel else 1)
    r, f = model.kv_heads / model.num_heads, model.ffn / h
    if model.is_llama:
        attention = [(norm, norm), (1 / t, 1.0), (r / t, 1.0), (r / t, 1.0), (1.0, 1 / t)]
        mlp = [(norm, norm), (f / t, 1.0), (f / t, 1.0), (1.0, f / t)]
    else:
        attention = [(norm, norm), (3 / t, 1.0), (1.0, 1 / t)]
        mlp = [(norm, norm), (f / t, 1.0), (1.0, f / t)]
    groups = {"whole": attention + mlp, "attention": attention, "mlp": mlp}[part]
    return [(kept * unit, asked * unit) for kept, asked in groups]


def input_pass_steps(model: Model, plan: Plan, core_bytes: float, *, seq_len: int | None = None,
                     part: BlockPart = "whole") -> list[tuple[float, float]]:
    """A split backward's I through a block (or part), one micro-batch, one TP rank, in the order it
    runs the block's operators (the last first): per step (kept, asked), bytes. ``kept``: the output
    gradient I starts keeping there for its parameter group (:func:`weight_pass_groups`, whose kept
    column this one's sums to); ``asked``: what the step's operator unpacks, which a swapped block
    brings back then — a GEMM's input (its node unpacks every tensor it saved), the GeLU's or
    SwiGLU's inputs, a norm's input, and the attention core's tensors at once (``core_bytes``)."""
    s, b, h = plan.rank_seq_len(seq_len or model.seq_len), plan.micro_batch_size, model.hidden_size
    t, unit = plan.tp, DTYPE_BYTES[plan.precision] * s * b * h
    norm = 1 / (t if plan.sequence_parallel else 1)
    r, f = model.kv_heads / model.num_heads, model.ffn / h
    core = core_bytes / unit
    if model.is_llama:
        attention = [(1.0, 1 / t), (0.0, core), (r / t, 1.0), (r / t, 1.0), (1 / t, 1.0), (norm, norm)]
        mlp = [(1.0, f / t), (0.0, 2 * f / t), (0.0, f / t), (f / t, 1.0), (f / t, 1.0), (norm, norm)]
    else:
        attention = [(1.0, 1 / t), (0.0, core), (3 / t, 1.0), (norm, norm)]
        mlp = [(1.0, f / t), (0.0, f / t), (f / t, 1.0), (norm, norm)]
    steps = {"whole": mlp + attention, "attention": attention, "mlp": mlp}[part]
    return [(kept * unit, asked * unit) for kept, asked in steps]


def weight_pass_grad_bytes(model: Model, plan: Plan, *, seq_len: int | None = None, part: BlockPart = "whole") -> float:
    """Output gradients a split backward's I keeps of one block (or part) for its W, one micro-batch,
    one TP rank: the kept column of :func:`weight_pass_groups`. Not on the first stage, whose I does
    nothing."""
    return sum(kept for kept, _ in weight_pass_groups(model, plan, seq_len=seq_len, part=part))


def final_norm_grad_bytes(model: Model, plan: Plan, *, seq_len: int | None = None) -> float:
    """The final norm's output gradient a split backward's I keeps for its W (its own parameter
    group; :func:`weight_pass_grad_bytes`): s·b·h·d, ÷t under sequence parallelism."""
    s, b = plan.rank_seq_len(seq_len or model.seq_len), plan.micro_batch_size
    seq_shard = plan.tp if plan.sequence_parallel else 1
    return DTYPE_BYTES[plan.precision] * s * b * model.hidden_size / seq_shard


def _nongemm_bytes(model: Model, d: int, sbh: float, seq_shard: int, attention: bool, mlp: bool) -> float:
    """What a ``nongemm`` block (or part) keeps (:mod:`mindpipe.traces.layout`; the policy needs t = 1).

    Its input (d, ÷t when sequence-sharded; a whole block's MLP part re-runs its input from the
    attention projection's output, a part held alone keeps it as its input), the attention GEMM
    outputs — QKV, (1 + 2r)·d, and the projection, d — and the MLP's: fc1 (d·f/h; SwiGLU's gate and
    up, 2·d·f/h) and, with dropout, fc2 (d), whose output the MLP-dropout mask is re-drawn from.
    No dropout mask and nothing s²-sized is kept. GPT at f = 4h without dropout: 18·s·b·h at d = 2.
    """
    kv_ratio = model.kv_heads / model.num_heads
    f_out = (2 if model.is_llama else 1) * model.ffn / model.hidden_size
    att = (1 / seq_shard + 1 + 2 * kv_ratio + 1) * d * sbh if attention else 0.0
    mlp_out = (f_out + (1 if model.dropout else 0)) * d * sbh + (0.0 if attention else d * sbh / seq_shard)
    return att + (mlp_out if mlp else 0.0)


def embedding_activation_bytes(
    model: Model, plan: Plan, *, seq_len: int | None = None, mask_bytes: int | None = None
) -> float:
    """Bytes the first stage keeps outside its blocks per micro-batch: token ids and the
    embedding-dropout mask (Korthikanti §4.3's s·b·h/t with sequence parallelism; replicated without)."""
    s, b = plan.rank_seq_len(seq_len or model.seq_len), plan.micro_batch_size
    seq_shard = plan.tp if plan.sequence_parallel else 1
    return TOKEN_ID_BYTES * s * b + _mask_bytes(model, mask_bytes) * s * b * model.hidden_size / seq_shard


__all__ = ["FLASH_STAT_BYTES", "GEMM_INPUT_BYTES", "GPU_MASK_BYTES", "TOKEN_ID_BYTES", "activation_bytes_per_layer",
           "embedding_activation_bytes", "final_norm_grad_bytes", "input_pass_steps",
           "weight_pass_grad_bytes", "weight_pass_groups"]
