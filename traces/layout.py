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

**Activation policy per block.** What a block stores for its backward:

* ``none`` — everything (no recompute);
* ``selective`` — everything but the attention core (Q·Kᵀ, softmax, dropout, ·V), which is
  re-run in the backward (Korthikanti et al. 2022, §5);
* ``full`` — only the block's input; the whole forward is re-run before the backward;
* ``swap`` — everything, but copied to host memory after the forward and back before the
  backward (vPipe, Zhao et al. TPDS'21), so nothing stays on the device.

``plan.recompute`` sets the level of every block; ``plan.layer_memory_policy`` (vPipe's per-layer
choice) overrides it block by block: ``keep`` keeps everything (``none``, whatever
``plan.recompute`` says — vPipe's "keep" is the absence of recompute and swap), ``recompute`` is
``full`` and ``swap`` is ``swap``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mindpipe.traces.config import V_SCHEDULES, Model, Plan, stage_layers

BlockPolicy = Literal["none", "selective", "full", "swap"]
BLOCK_POLICIES: tuple[BlockPolicy, ...] = ("none", "selective", "full", "swap")
# vPipe's per-layer choices (``Plan.layer_memory_policy``) as block policies.
LAYER_POLICY: dict[str, BlockPolicy] = {"keep": "none", "recompute": "full", "swap": "swap"}


def block_policies(plan: Plan, num_layers: int) -> list[BlockPolicy]:
    """The activation policy of every block (module docstring), in block order."""
    if plan.layer_memory_policy is not None:
        return [LAYER_POLICY[p] for p in plan.layer_memory_policy]
    level: BlockPolicy = plan.recompute  # type: ignore[assignment]  # RECOMPUTE ⊂ BLOCK_POLICIES
    return [level] * num_layers


def recomputes(policy: BlockPolicy) -> bool:
    """True when the block's forward (all or part) runs again before its backward."""
    return policy in ("selective", "full")


def reshards_after_forward(plan: Plan) -> bool:
    """ZeRO-3 frees each layer's gathered weights after its forward and gathers them again for the
    backward — except under pipelining, where they stay gathered for the whole step (torchtitan's
    ``reshard_after_forward = not pp_enabled``: re-gathering per micro-batch costs more than it saves).

    With gradient accumulation the weights stay gathered after a backward, so a step of m
    micro-batches gathers them m + 1 times (before the first forward and before each backward).
    """
    return plan.zero_stage == 3 and plan.dp > 1 and plan.pp == 1


def data_parallel_units(plan: Plan, num_blocks: int) -> int:
    """Modules of a stage of ``num_blocks`` blocks that the data-parallel wrapper hooks.

    The executor wraps nothing with one fp32 replica, the whole stage under replication
    (``zero_stage`` 0: FSDP2's ``replicate``), and every block plus the stage under ``fully_shard``
    (ZeRO ≥ 1). Each wrapped module runs hooks around its forward and backward (unshard, reshard,
    gradient bookkeeping), a host cost calibration fits per module.
    """
    if plan.dp == 1 and plan.precision == "fp32":
        return 0
    return 1 if plan.zero_stage == 0 else num_blocks + 1


def loop_stage_to_rank(pp: int, num_stages: int) -> list[int]:
    """Interleaved ("loop") placement: virtual stage s on rank s mod pp."""
    return [s % pp for s in range(num_stages)]


def v_stage_to_rank(pp: int, num_stages: int) -> list[int]:
    """"V" placement of two chunks per rank: rank r holds stages r and 2·pp−1−r."""
    if num_stages != 2 * pp:
        raise ValueError(f"V placement needs 2·pp stages, got {num_stages} for pp={pp}")
    return [s if s < pp else 2 * pp - 1 - s for s in range(num_stages)]


def stage_to_rank(plan: Plan) -> list[int]:
    """Pipeline rank of every virtual stage under the plan's schedule."""
    if plan.schedule in V_SCHEDULES:
        return v_stage_to_rank(plan.pp, plan.num_stages)
    return loop_stage_to_rank(plan.pp, plan.num_stages)


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
    """

    stage: int
    rank: int
    first_block: int
    num_blocks: int
    has_embedding: bool
    has_head: bool

    @property
    def blocks(self) -> range:
        """Global indices of its blocks."""
        return range(self.first_block, self.first_block + self.num_blocks)

    def layer_names(self) -> list[str]:
        """Pipeline layers it runs, in order (``embedding``, ``block.i`` …, ``final_norm``, ``lm_head``)."""
        names = ["embedding"] if self.has_embedding else []
        names += [f"block.{i}" for i in self.blocks]
        return names + (["final_norm", "lm_head"] if self.has_head else [])


def stage_layout(plan: Plan, model: Model) -> list[StageSpan]:
    """Every virtual stage of ``plan`` on ``model`` (module docstring)."""
    counts = stage_layers(plan, model)
    ranks = stage_to_rank(plan)
    last = len(counts) - 1
    out: list[StageSpan] = []
    first = 0
    for s, n in enumerate(counts):
        out.append(StageSpan(s, ranks[s], first, n, s == 0, s == last))
        first += n
    return out


def rank_stages(plan: Plan, pp_rank: int) -> list[int]:
    """Virtual stages of pipeline rank ``pp_rank``, ascending."""
    return [s for s, r in enumerate(stage_to_rank(plan)) if r == pp_rank]


__all__ = [
    "BLOCK_POLICIES",
    "LAYER_POLICY",
    "BlockPolicy",
    "StageSpan",
    "block_policies",
    "data_parallel_units",
    "loop_stage_to_rank",
    "rank_stages",
    "recomputes",
    "reshards_after_forward",
    "stage_layout",
    "stage_to_rank",
    "v_stage_to_rank",
]
