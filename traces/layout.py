"""The plan rules every part of MindPipe asks: which blocks a stage holds, where each stage runs,
and what each block keeps for its backward.

These are rules about the :class:`~mindpipe.traces.config.Plan` contract, written once here and
asked by the simulator (costs, memory, engine work), the tuner (partitions, memory caps),
calibration (features of measured actions) and the executor (the modules it builds and wraps).
A second copy of any of them is a bug waiting to happen (DESIGN.md, "one owner per rule").

**Stage layout.** A plan has ``pp × virtual_stages`` virtual stages in pipeline order. The
partition (``plan.partition``, else an even split with the remainder to the first stages, torch's
default) says how many transformer blocks each holds, consecutively; the embedding joins the first
stage and the final norm and LM head the last. Virtual stage ``s`` runs on pipeline rank
``s mod pp`` ("loop": Megatron's and torch's interleaving), or in a "V" for ``zbv`` and
``dualpipev`` (rank ``r`` holds stages ``r`` and ``2·pp−1−r``; Qi et al. ICLR'24, torch's
``generate_stage_to_rank_mapping(style="v")``).

**Cuts inside a block.** ``plan.stage_cuts`` may place the boundary after stage ``k``
``after_attention``: stage ``k``'s last block is split after its attention sub-layer's residual
add (``x + attn(ln1(x))``), stage ``k`` runs that block's ``attention`` part (ln1, attention,
residual add) and stage ``k + 1`` begins with its ``mlp`` part (ln2, MLP, residual add). Only the
residual stream crosses there, one ``[b, s, h]`` tensor as between blocks, so the executor splits
the block into two modules without changing what it computes. The partition still counts the
blocks each stage *starts*; a stage that begins with an ``mlp`` part holds one block more than it
starts. In the block's operator graph (:mod:`mindpipe.traces.op_graph`) the cut falls after the
unit :data:`CUT_UNITS` names, and a block's units up to and including it are its ``attention``
part. This is the one boundary inside a block that runs: a cut after any other unit would send
more than one tensor (the residual and a branch value) between stages.

**Activation policy per block.** What a block stores for its backward:

* ``none`` — everything (no recompute);
* ``selective`` — everything but the attention core (Q·Kᵀ, softmax, dropout, ·V), which is
  re-run in the backward (Korthikanti et al. 2022, §5);
* ``nongemm`` — the block's input and its GEMM outputs (QKV, or Q, K and V; the attention
  projection; fc1, or SwiGLU's gate and up; and, when the model has dropout, fc2 or down, whose
  output the MLP-dropout mask is re-drawn from); every other operator — LayerNorms, the attention
  core, GeLU or SwiGLU, dropouts, residual adds — is re-run before the backward from them, so no
  GEMM runs twice. DawnPiper's per-operator choice (Peng et al. 2025, Capuchin-style): the cheap
  memory-bound operators and the attention core free most of a block's bytes for a small share of
  its forward. The executor runs it with torch's selective activation checkpointing; it needs
  ``tp = 1`` and a schedule without a split backward (:func:`nongemm_refusal`);
* ``full`` — only the block's input; the whole forward is re-run before the backward;
* ``swap`` — everything, but copied to host memory after the forward and back before the
  backward (vPipe, Zhao et al. TPDS'21), so nothing stays on the device.

``plan.recompute`` sets the level of every block; ``plan.layer_memory_policy`` (vPipe's per-layer
choice) overrides it block by block: ``keep`` keeps everything (``none``, whatever
``plan.recompute`` says — vPipe's "keep" is the absence of recompute and swap), ``selective`` and
``nongemm`` are themselves (DawnPiper's operator-level choices), ``recompute`` is ``full`` and
``swap`` is ``swap``.

A block cut by a stage boundary keeps its one policy, applied to each part on its own stage: the
simulator prices each part's bytes under it (:func:`mindpipe.simulator.memory.activation_bytes_per_layer`
with ``part=``), a ``full`` part re-runs its own forward, and a ``swap`` part copies its own saved
tensors (the executor wraps each part's module as it wraps a block; the simulator's engine still
prices each swapped part's copy at a whole block's bytes, an overestimate). ``selective`` and
``nongemm`` on a cut block are refused by the executor (its precheck), so the memory planners never
give a cut block one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from mindpipe.traces.config import Model, Plan, stage_layers
from mindpipe.traces.schedule_rules import SPLIT_BACKWARD_SCHEDULES, V_SCHEDULES

BlockPolicy = Literal["none", "selective", "nongemm", "full", "swap"]
BLOCK_POLICIES: tuple[BlockPolicy, ...] = ("none", "selective", "nongemm", "full", "swap")
# vPipe's per-layer choices (``Plan.layer_memory_policy``) as block policies.
LAYER_POLICY: dict[str, BlockPolicy] = {"keep": "none", "selective": "selective", "nongemm": "nongemm",
                                        "recompute": "full", "swap": "swap"}
# Block policies a block cut by a stage boundary cannot take (:func:`cut_block_refusal`).
WHOLE_BLOCK_ONLY: tuple[BlockPolicy, ...] = ("selective", "nongemm")

BlockPart = Literal["whole", "attention", "mlp"]
# The operator-graph unit of a block (the torch.fx node of ``Block.forward``) after which each cut
# inside a block falls: ``add_1`` is the first residual add (``add`` is the attention mask's).
CUT_UNITS: dict[str, str] = {"after_attention": "add_1"}


def block_policies(plan: Plan, num_layers: int) -> list[BlockPolicy]:
    """The activation policy of every block (module docstring), in block order."""
    if plan.layer_memory_policy is not None:
        return [LAYER_POLICY[p] for p in plan.layer_memory_policy]
    level: BlockPolicy = plan.recompute  # type: ignore[assignment]  # RECOMPUTE ⊂ BLOCK_POLICIES
    return [level] * num_layers


def lazy_copy_back(plan: Plan) -> frozenset[int]:
    """The (virtual) stages whose swapped blocks come back as each backward asks for them, not
    prefetched (``Plan.swap_copy_back``; what prefetching means is
    :func:`mindpipe.simulator.actions.prefetched_backward`'s)."""
    return frozenset(s for s, how in enumerate(plan.swap_copy_back or ()) if how == "lazy")


def recomputes(policy: BlockPolicy) -> bool:
    """True when the block's forward (all or part) runs again before its backward."""
    return policy in ("selective", "nongemm", "full")


def weight_groups(model: Model, part: BlockPart = "whole") -> int:
    """Parameter groups of a block (or part) under a split backward: one per module with parameters
    (GPT: LayerNorm, QKV, projection | LayerNorm, fc1, fc2; Llama: RMSNorm, wq, wk, wv, wo | RMSNorm,
    gate, up, down). torch's ``stage_backward_weight`` takes one autograd pass per group, and a
    fully recomputed block re-runs its forward in each (``tests/executor/test_one_weight_pass.py``
    checks the counts on the executor's blocks)."""
    attention, mlp = (5, 4) if model.is_llama else (3, 3)
    return {"whole": attention + mlp, "attention": attention, "mlp": mlp}[part]


def one_weight_pass(model: Model, span: StageSpan, policies: Sequence[BlockPolicy]) -> bool:
    """Whether the executor runs a split backward's W of stage ``span`` as one autograd pass
    (:func:`mindpipe.executor.torch_pipelining.merge_weight_passes`) instead of torch's pass per
    parameter group; ``policies`` are the plan's block policies (:func:`block_policies`).

    Per group, a fully recomputed block (or part) re-runs its forward once per group
    (:func:`weight_groups`); one pass re-runs it once but walks the input-gradient path of every
    block below the stage's top group again (torch clamps the gradients, not the work): about one
    forward per block or part. One pass is taken when the re-runs it saves outnumber the blocks it
    walks again. Never on the first stage, whose W is already the whole backward in one pass.
    """
    return span.stage > 0 and merged_weight_pass(model, [policies[b] for b in span.blocks], [p for _, p in span.parts()])


def merged_weight_pass(model: Model, policies: Sequence[BlockPolicy], parts: Sequence[BlockPart]) -> bool:
    """:func:`one_weight_pass`'s rule for a stage other than the first holding blocks (or parts, ``parts``)
    with ``policies``: the fully recomputed ones' saved re-runs outnumber the blocks."""
    saved = sum(weight_groups(model, part) - 1 for p, part in zip(policies, parts, strict=True) if p == "full")
    return saved > len(policies)


def reshards_after_forward(plan: Plan) -> bool:
    """ZeRO-3 frees each layer's gathered weights after its forward and gathers them again for the
    backward — except under pipelining, where they stay gathered for the whole step (torchtitan's
    ``reshard_after_forward = not pp_enabled``: re-gathering per micro-batch costs more than it saves).

    With gradient accumulation the weights are freed after each backward too
    (:func:`reduces_every_microbatch`), so a step of m micro-batches gathers them 2·m times.
    """
    return plan.zero_stage == 3 and plan.grad_replicas > 1 and plan.pp == 1


def keeps_gathered_weights(plan: Plan) -> bool:
    """FSDP2 over dp > 1 gathers every weight before a layer's first forward into a buffer of its
    own and keeps the whole copy for the step unless ZeRO-3 frees it after each forward
    (:func:`reshards_after_forward`): the rank then holds the gathered weights beside their local
    storage. This holds for ``replicate`` (``zero_stage`` 0) too: FSDP2's replication is sharding
    over a mesh dimension of size one, and its "all-gather" still copies each parameter into a new
    buffer (checked on CPU/gloo: the unsharded parameter's storage is not the replica's), so an
    fp32 replica holds its weights twice during the step.

    Megatron-LM's data parallelism (``plan.dp_impl`` ``megatron``) keeps no such copy for ZeRO-0/1/2:
    its DDP reduces the gradients in their own buffer and the distributed optimizer all-gathers the
    updated shards straight into the parameters' one buffer (Megatron-LM
    ``distributed_data_parallel.py``, ``param_and_grad_buffer.py``), so an fp32 rank holds its weights
    once. ZeRO-3 gathers into buffers of its own under either.
    """
    if plan.dp_impl != "fsdp2" and plan.zero_stage < 3:
        return False
    return plan.grad_replicas > 1 and not reshards_after_forward(plan)


def reduces_every_microbatch(plan: Plan) -> bool:
    """ZeRO-2/3 without pipelining reduce-scatter each micro-batch's gradients during its backward
    (FSDP2's default, torchtitan's gradient accumulation): each module's reduce-scatter is issued
    as the backward produces its gradients, the rank keeps only its gradient shard, for one
    reduce-scatter per micro-batch instead of one per step, and the weights are resharded after
    each backward, so they are gathered again before the next micro-batch's forward (and, under
    ZeRO-3, before each backward). This holds for one micro-batch too: torch's pipelining runtime,
    which runs the single stage, would otherwise turn gradient sync off for the backward and
    reduce the whole gradients after it, unoverlapped, holding them unsharded meanwhile. Under
    pipelining torch's runtime reduces once per step (:func:`accumulates_whole_gradients`).
    """
    return plan.zero_stage >= 2 and plan.grad_replicas > 1 and plan.pp == 1


def accumulates_whole_gradients(plan: Plan) -> bool:
    """Under ZeRO-2/3 with pipelining FSDP2 reduce-scatters a step's gradients only after its last
    micro-batch: the earlier backwards accumulate them whole (torch's pipelining runtime turns
    gradient sync off for every backward but the last), so the rank holds unsharded gradients until
    the step ends. Without pipelining the executor keeps FSDP2's per-micro-batch reduction
    (:func:`reduces_every_microbatch`).
    """
    return plan.zero_stage >= 2 and plan.grad_replicas > 1 and plan.num_microbatches > 1 and not reduces_every_microbatch(plan)


def shards_reduced_gradients(plan: Plan) -> bool:
    """After a stage's gradients are reduced (torch's pipelining runtime: right after the stage's
    last backward of the step), the rank keeps only its shard of them: FSDP2's reduce-scatter under
    ZeRO ≥ 1 over dp > 1 (``zero_stage`` 1 runs as FSDP2 without resharding after the forward).
    ``replicate`` (ZeRO-0) all-reduces them whole, and Megatron-LM's DDP (``dp_impl`` ``megatron``)
    reduces them in its gradient buffer, which stays whole.
    """
    return plan.dp_impl == "fsdp2" and plan.zero_stage >= 1 and plan.grad_replicas > 1


def data_parallel_units(plan: Plan, num_blocks: int) -> int:
    """Modules of a stage of ``num_blocks`` blocks that the data-parallel wrapper hooks.

    The executor wraps nothing with one fp32 replica, the whole stage under replication
    (``zero_stage`` 0: FSDP2's ``replicate``), and every block plus the stage under ``fully_shard``
    (ZeRO ≥ 1). Each wrapped module runs hooks around its forward and backward (unshard, reshard,
    gradient bookkeeping), a host cost calibration fits per module.
    """
    if plan.grad_replicas == 1 and plan.precision == "fp32":
        return 0
    return 1 if plan.zero_stage == 0 else num_blocks + 1


def copies_dp_buffers(plan: Plan) -> bool:
    """Whether the data-parallel wrapper copies weights and gradients on the compute stream.

    FSDP2 (``plan.dp_impl`` ``fsdp2``: ``replicate`` and ``fully_shard`` alike, wherever
    :func:`data_parallel_units` wraps a stage) copies each gathered parameter out of its all-gather
    buffer once the gather lands (``foreach_all_gather_copy_out``; under ``replicate`` the copy of
    ``wait_for_unshard``) and, before each reduction, the gradients into one flat buffer in the
    reduction's dtype (``foreach_reduce_scatter_copy_in``), both on the current stream (torch
    2.13's ``torch/distributed/fsdp/_fully_shard``). A step gathers the weights at least once: they
    are resharded after the last backward. Megatron-LM's contiguous buffers (``megatron``) reduce
    and gather in place and copy nothing.
    """
    return data_parallel_units(plan, 1) > 0 and plan.dp_impl == "fsdp2"


def gathers_before_forward(plan: Plan) -> bool:
    """Whether a stage's sharded weights are all-gathered before its first forward of the step,
    module by module, each gather under the compute before it (FSDP2's prefetch).

    ZeRO-3 always (the weights are sharded at rest). ZeRO-1/2 under FSDP2 too: the executor runs
    them as ``fully_shard``, resharded after the step's last backward, so the step's first forward
    gathers them again (the same as ZeRO-3 under pipelining). Megatron's distributed optimizer
    (``dp_impl`` ``megatron``) instead all-gathers ZeRO-1/2's updated shards after the optimizer
    step, into the parameters in place.
    """
    if plan.grad_replicas == 1:
        return False
    return plan.zero_stage == 3 or (plan.zero_stage in (1, 2) and plan.dp_impl == "fsdp2")


def loop_stage_to_rank(pp: int, num_stages: int) -> list[int]:
    """Interleaved ("loop") placement: virtual stage s on rank s mod pp."""
    return [s % pp for s in range(num_stages)]


def v_stage_to_rank(pp: int, num_stages: int) -> list[int]:
    """"V" placement of two chunks per rank: rank r holds stages r and 2·pp−1−r."""
    if num_stages != 2 * pp:
        raise ValueError(f"V placement needs 2·pp stages, got {num_stages} for pp={pp}")
    return [s if s < pp else 2 * pp - 1 - s for s in range(num_stages)]


def schedule_stage_to_rank(schedule: str, pp: int, num_stages: int) -> list[int]:
    """Pipeline rank of every virtual stage under ``schedule``: "V" placement for the V schedules,
    loop placement for the others (the one owner: :func:`stage_to_rank` and
    :func:`mindpipe.simulator.schedules.build_schedule` both ask it)."""
    if schedule in V_SCHEDULES:
        return v_stage_to_rank(pp, num_stages)
    return loop_stage_to_rank(pp, num_stages)


def stage_to_rank(plan: Plan) -> list[int]:
    """Pipeline rank of every virtual stage under the plan's schedule."""
    return schedule_stage_to_rank(plan.schedule, plan.pp, plan.num_stages)


@dataclass(frozen=True)
class StageSpan:
    """One virtual stage: where it runs and which layers it holds.

    Attributes:
        stage: Virtual stage index in pipeline order.
        rank: Pipeline rank that runs it.
        first_block: Global index of its first transformer block.
        num_blocks: Transformer blocks it holds (consecutive).
        has_embedding: It holds the token and position embeddings (the first stage).
        has_head: It holds the final norm and the LM head with the loss (the last stage).
        first_part: What it runs of its first block: ``whole``, or ``mlp`` when the boundary
            before it is cut inside that block (module docstring).
        last_part: What it runs of its last block: ``whole``, or ``attention`` when the boundary
            after it is cut inside that block.
    """

    stage: int
    rank: int
    first_block: int
    num_blocks: int
    has_embedding: bool
    has_head: bool
    first_part: BlockPart = "whole"
    last_part: BlockPart = "whole"

    @property
    def blocks(self) -> range:
        """Global indices of its blocks, a partly held one included."""
        return range(self.first_block, self.first_block + self.num_blocks)

    def part(self, block: int) -> BlockPart:
        """What it runs of block ``block`` (one of :attr:`blocks`)."""
        if block == self.first_block and self.first_part != "whole":
            return self.first_part
        if block == self.first_block + self.num_blocks - 1 and self.last_part != "whole":
            return self.last_part
        return "whole"

    def parts(self) -> list[tuple[int, BlockPart]]:
        """(global block index, part it runs) of its blocks, in order."""
        return [(b, self.part(b)) for b in self.blocks]

    def layer_names(self) -> list[str]:
        """Pipeline layers it runs, in order (``embedding``, ``block.i`` …, ``final_norm``, ``lm_head``);
        a partly held block is ``block.i.attention`` or ``block.i.mlp`` (:func:`block_layer_name`)."""
        names = ["embedding"] if self.has_embedding else []
        names += [block_layer_name(b, p) for b, p in self.parts()]
        return names + (["final_norm", "lm_head"] if self.has_head else [])


def block_layer_name(block: int, part: BlockPart = "whole") -> str:
    """``block.i`` for a whole block, ``block.i.attention`` / ``block.i.mlp`` for a part of one."""
    return f"block.{block}" if part == "whole" else f"block.{block}.{part}"


def stage_layout(plan: Plan, model: Model) -> list[StageSpan]:
    """Every virtual stage of ``plan`` on ``model`` (module docstring)."""
    counts = stage_layers(plan, model)
    ranks = stage_to_rank(plan)
    last = len(counts) - 1
    inside = [c != "between_blocks" for c in plan.stage_cuts or ["between_blocks"] * last]
    out: list[StageSpan] = []
    first = 0
    for s, n in enumerate(counts):
        cut_in = s > 0 and inside[s - 1]
        cut_out = s < last and inside[s]
        out.append(StageSpan(s, ranks[s], first - cut_in, n + cut_in, s == 0, s == last,
                             "mlp" if cut_in else "whole", "attention" if cut_out else "whole"))
        first += n
    return out


def rank_stages(plan: Plan, pp_rank: int) -> list[int]:
    """Virtual stages of pipeline rank ``pp_rank``, ascending."""
    return [s for s, r in enumerate(stage_to_rank(plan)) if r == pp_rank]


def tied_table_ranks(plan: Plan, model: Model) -> tuple[int, int] | None:
    """Pipeline ranks of the token table and of the last stage's copy of it, or None when there is no copy.

    A tied LM head (``model.tie_embeddings``) reuses the token table. With one stage the stage
    holds the one table for both. With more, the last stage holds a copy of the table (its head's
    weight, tensor-parallel over the vocabulary as the table is) and, after the last backward and
    before the optimizer step, the two copies' gradients are summed — all-reduced between the two
    pipeline ranks at the same (dp, cp, tp) coordinates, or added in place when one rank holds both
    stages (a "V" schedule) — so both take the same step and stay equal (Megatron-LM's embedding
    group). The copy's parameters, gradients and optimizer state are the last stage's memory; the
    exchange is priced by the simulator and run by the executor from this rule.
    """
    if not model.tie_embeddings or plan.num_stages == 1:
        return None
    ranks = stage_to_rank(plan)
    return ranks[0], ranks[-1]


def nongemm_refusal(plan: Plan) -> str | None:
    """Why ``plan`` cannot give a block the ``nongemm`` policy (:mod:`mindpipe.traces.layout`), or None.

    Under TP the row-parallel GEMMs' kept outputs would be unreduced partial sums and the re-run
    would re-issue the sub-layers' collectives, neither modelled; a split backward (zero-bubble
    schedules) runs a block's backward more than once, which torch's selective activation
    checkpointing refuses ("only allowed to backward once").
    """
    if plan.tp > 1:
        return f"policy 'nongemm' needs tp=1 (plan has tp={plan.tp})"
    if plan.schedule in SPLIT_BACKWARD_SCHEDULES:
        return f"policy 'nongemm' cannot run under schedule {plan.schedule!r}: its split backward runs a block's backward twice"
    return None


def cut_block_refusal(plan: Plan, model: Model) -> str | None:
    """Why a block that a stage boundary cuts cannot take its policy, or None (the Plan's rule, :func:`check_plan`).

    A cut block runs as two parts on two ranks; re-running only its attention core or its non-GEMM
    operators (:data:`WHOLE_BLOCK_ONLY`: ``selective``, ``nongemm``) needs the whole block on one
    rank, so the simulator would price, and the executor could not run, such a plan.
    """
    policies = block_policies(plan, model.num_layers)
    for span in stage_layout(plan, model):
        if span.last_part != "whole" and policies[span.blocks[-1]] in WHOLE_BLOCK_ONLY:
            return (f"block {span.blocks[-1]} is cut by a stage boundary: give it recompute none, full or swap, "
                    f"not {policies[span.blocks[-1]]}")
    return None


__all__ = [
    "BLOCK_POLICIES",
    "CUT_UNITS",
    "LAYER_POLICY",
    "WHOLE_BLOCK_ONLY",
    "BlockPart",
    "BlockPolicy",
    "StageSpan",
    "accumulates_whole_gradients",
    "block_layer_name",
    "block_policies",
    "copies_dp_buffers",
    "cut_block_refusal",
    "data_parallel_units",
    "gathers_before_forward",
    "keeps_gathered_weights",
    "loop_stage_to_rank",
    "nongemm_refusal",
    "rank_stages",
    "recomputes",
    "reduces_every_microbatch",
    "reshards_after_forward",
    "schedule_stage_to_rank",
    "shards_reduced_gradients",
    "stage_layout",
    "stage_to_rank",
    "tied_table_ranks",
    "v_stage_to_rank",
]
