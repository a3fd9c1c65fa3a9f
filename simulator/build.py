"""Turn per-layer costs and a plan into the engine's per-stage and per-rank work.

Layers are assigned to virtual stages by the plan's partition (blocks per stage; even split by
default): the embedding joins the first stage, the final norm and LM head the last. Recompute adds
the re-run forward before the input gradient: ``full`` re-runs every block's forward (and its
tensor-parallel collectives — Megatron's checkpointed layers re-issue them), ``selective`` only
the attention core (Korthikanti et al. §5); a per-block ``layer_memory_policy`` overrides the plan
(``recompute`` as full, ``swap`` copies the block's activations to the host after F and back
before I over PCIe, ``keep`` stores them).

Gradient reduction: bucket size as Megatron's DDP (max(40M, 1M × dp) parameters), all-reduce
without ZeRO, reduce-scatter with ZeRO ≥ 1 (Megatron's distributed optimizer is ZeRO-1);
gradients travel in fp32 under bf16 (Megatron forces fp32 gradient accumulation for bf16), in
the parameter dtype otherwise.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from mindpipe.simulator.costs import DTYPE_BYTES, Collective, ComputeModel, LayerCost
from mindpipe.simulator.engine import RankWork, StageWork
from mindpipe.simulator.topology import Phase, Topology
from mindpipe.traces.config import Model, Plan, stage_layers

GRAD_BYTES = {"fp32": 4, "bf16": 4, "fp16": 2}


def bucket_params(plan: Plan) -> int:
    """Parameters per gradient bucket (Megatron DDP default: max(40M, 1M × dp))."""
    return max(40_000_000, 1_000_000 * plan.dp)


def assign_layers(costs: list[LayerCost], model: Model, plan: Plan) -> list[list[LayerCost]]:
    """Split the pipeline-ordered layer costs into virtual stages."""
    per_stage = stage_layers(plan, model)
    blocks = [c for c in costs if c.kind == "block"]
    head = [c for c in costs if c.kind in ("embedding",)]
    tail = [c for c in costs if c.kind in ("final_norm", "lm_head")]
    stages: list[list[LayerCost]] = []
    i = 0
    for s, n in enumerate(per_stage):
        layers = list(blocks[i:i + n])
        i += n
        if s == 0:
            layers = head + layers
        if s == len(per_stage) - 1:
            layers = layers + tail
        stages.append(layers)
    return stages


def _merge(colls: list[Collective]) -> list[tuple[str, int, int]]:
    """Collapse back-to-back collectives of one kind and size into (op, bytes, count)."""
    counts = Counter((c.op, c.nbytes) for c in colls)
    return [(op, n, k) for (op, n), k in counts.items()]


def _tp_phases(topo: Topology, colls: list[Collective], rank: int) -> list[Phase]:
    out: list[Phase] = []
    for op, nbytes, count in _merge(colls):
        out += topo.collective(op, nbytes, "tp", rank, count=count)
    return out


def _buckets(topo: Topology, op: str, total_params: int, bytes_per_param: int, bucket: int, rank: int) -> list[list[Phase]]:
    if total_params <= 0 or topo.plan.dp == 1:
        return []
    n = max(1, math.ceil(total_params / bucket))
    per = total_params / n
    return [topo.collective(op, per * bytes_per_param, "dp", rank) for _ in range(n)]


def build_work(
    model: Model,
    plan: Plan,
    costs: list[LayerCost],
    compute: ComputeModel,
    topo: Topology,
    stage_to_rank: list[int],
    swap_bytes_per_block: Callable[[], float] | None = None,
) -> tuple[list[StageWork], list[RankWork], list[int]]:
    """Per-stage work, per-rank work and per-rank parameter counts for the engine."""
    stages = assign_layers(costs, model, plan)
    policy = plan.layer_memory_policy
    dbytes = DTYPE_BYTES[plan.precision]
    gbytes = GRAD_BYTES[plan.precision]
    bucket = bucket_params(plan)
    block_index = 0
    works: list[StageWork] = []
    params_by_stage: list[int] = []
    for s, layers in enumerate(stages):
        rank = stage_to_rank[s]
        f = sum(c.forward_s for c in layers)
        i = sum(c.backward_input_s for c in layers)
        w = sum(c.backward_weight_s for c in layers)
        recompute = 0.0
        re_comm: list[Collective] = []
        swap = 0.0
        fwd_comm: list[Collective] = []
        bwd_comm: list[Collective] = []
        for c in layers:
            fwd_comm += c.forward_comm
            bwd_comm += c.backward_comm
            if c.kind != "block":
                continue
            mode = plan.recompute
            if policy is not None:
                mode = {"keep": "none", "recompute": "full", "swap": "swap"}[policy[block_index]]
            block_index += 1
            if mode == "full":
                recompute += c.forward_s
                re_comm += c.forward_comm
            elif mode == "selective":
                recompute += c.recompute_selective_s
            elif mode == "swap" and swap_bytes_per_block is not None:
                swap += swap_bytes_per_block()
        params = sum(c.param_count for c in layers)
        params_by_stage.append(params)
        out_bytes = layers[-1].output_bytes
        in_bytes = stages[s - 1][-1].output_bytes if s > 0 else 0
        nxt = stage_to_rank[s + 1] if s + 1 < len(stages) else None
        prv = stage_to_rank[s - 1] if s > 0 else None
        zero = plan.zero_stage
        work = StageWork(
            forward_s=f,
            input_s=i,
            weight_s=w,
            recompute_s=recompute,
            fwd_tp=_tp_phases(topo, fwd_comm, rank),
            bwd_tp=_tp_phases(topo, re_comm + bwd_comm, rank),
            send_fwd=topo.p2p(rank, nxt, out_bytes) if nxt is not None and nxt != rank else None,
            send_bwd=topo.p2p(rank, prv, in_bytes) if prv is not None and prv != rank else None,
            dp_buckets=_buckets(topo, "allreduce" if zero == 0 else "reducescatter", params, gbytes, bucket, rank),
            gather_buckets=_buckets(topo, "allgather", params, dbytes, bucket, rank) if zero == 3 else [],
            swap_out=topo.swap(rank, swap) if swap > 0 else [],
            swap_in=topo.swap(rank, swap) if swap > 0 else [],
        )
        works.append(work)
    ranks: list[RankWork] = []
    params_by_rank = [0] * plan.pp
    for s, n in enumerate(params_by_stage):
        params_by_rank[stage_to_rank[s]] += n
    for r in range(plan.pp):
        shard = params_by_rank[r] / plan.dp if plan.zero_stage >= 1 else params_by_rank[r]
        gather = (_buckets(topo, "allgather", params_by_rank[r], dbytes, bucket, r)
                  if plan.zero_stage in (1, 2) else [])
        ranks.append(RankWork(optimizer_s=compute.optimizer_step_s(int(shard), plan), param_gather=gather))
    return works, ranks, params_by_rank


__all__ = ["GRAD_BYTES", "assign_layers", "bucket_params", "build_work"]
