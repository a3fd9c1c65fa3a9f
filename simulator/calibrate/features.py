"""What the calibrated model needs to explain each measured compute action, and what it really took.

**Features.** A measured action (F, B, I or W of one virtual stage for one micro-batch) runs the
operators of its stage's layers (:mod:`mindpipe.simulator.ops`). Under the calibrated model its time is
linear in the constants: ``Σ_kind scale_kind · Σ t_ref(op of kind) + op_overhead · #ops`` (plus
``tp_op_overhead · #ops + tp_comm_cpu · bytes`` when the layers are tensor-parallel). So an
action's feature vector is its per-kind reference time, its operator count (twice: all, and
tensor-parallel), the bytes it sends in tensor-parallel collectives and, for forward and backward
actions, the modules the data-parallel wrapper hooks (``dp_unit_overhead · units``:
:func:`mindpipe.traces.layout.data_parallel_units`); the layer
structure, recompute and stage assignment come from the same functions the simulator uses. On
CPUs a swapped block's copies run inside its actions, so the bytes each action copies are a
feature too (:func:`stage_swap_bytes`; 0 for every action of a run that swaps nothing, and then its
constant is not fitted). Under a split backward torch's I and W do host work of their own beyond
their operators (:func:`mindpipe.simulator.build.split_backward_walks`): the operators I walks to
group the parameters, W's passes and the operators those walk are three more features, 0 for B and F.
Under a split backward the executor's runtime (``torch.distributed.pipelining``) computes no input
gradient for the first stage, whose input is token ids: its I action does nothing and its W runs
the stage's whole backward, so their features are those of nothing and of B.

**Host CPU outside the actions.** A CPU rank also spends CPU time outside its compute actions:
the schedule's and autograd's bookkeeping around each action (per operator the action runs), a
fixed amount per iteration, and the host copies of its transfers (gloo over loopback), linear in
their algorithm steps and wire bytes (:func:`~mindpipe.simulator.calibrate.models.host_terms`).
:data:`HOST_FEATURES` counts these per rank and iteration from the same stage work the engine
runs (:func:`mindpipe.simulator.build.build_work`); a point-to-point message counts half at its sender and
half at its receiver (the engine charges it all to the sender; summed over ranks the two agree).

**Core sharing.** On a CPU host, ranks share ``cpus`` cores and each runs ``threads`` threads:
when n ranks compute at once each gets ``min(1, (cpus / threads) / n)`` of full speed (the OS
shares cores fairly among runnable threads). An action's *work* — what it would take alone — is
the integral of that rate over its measured interval, from the timeline of every rank's actions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from mindpipe.simulator.build import (
    assign_layers,
    build_work,
    split_backward_walks,
    stage_op_counts,
    stage_recompute,
    weight_pass_extra,
)
from mindpipe.simulator.calibrate.models import ReferenceOpTime, backend_of, host_terms, tp_wire_bytes
from mindpipe.simulator.costs import Collective, LayerCost, op_layer_costs, swap_weight_reread_bytes
from mindpipe.simulator.ops import Op
from mindpipe.simulator.planning import swap_bytes_per_block
from mindpipe.simulator.topology import Phase, Topology
from mindpipe.traces.calibration import OP_KINDS, ComputeCalibration
from mindpipe.traces.catalog import DeviceSpec
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.traces.layout import (
    BlockPolicy,
    StageSpan,
    block_policies,
    data_parallel_units,
    stage_layout,
    stage_to_rank,
)
from mindpipe.traces.measured import ActionRecord

# Per-operator features (summed over a stage's operators), then per-action ones.
OP_FEATURES = (*OP_KINDS, "ops", "tp_ops", "fresh_bytes")
FEATURES = (*OP_FEATURES, "tp_bytes", "dp_units", "swap_bytes", "split_input_ops", "weight_passes", "weight_pass_ops")
HOST_FEATURES = ("step", "ops", "comm_steps", "comm_bytes")


def constants(cal: ComputeCalibration) -> list[float]:
    """``cal``'s constants in ``FEATURES`` order: the action time is ``features · constants``."""
    named = {"ops": cal.op_overhead_s, "tp_ops": cal.tp_op_overhead_s, "fresh_bytes": cal.fresh_s_per_byte,
             "tp_bytes": cal.tp_comm_cpu_s_per_byte, "dp_units": cal.dp_unit_overhead_s,
             "swap_bytes": cal.swap_s_per_byte, "split_input_ops": cal.split_input_op_s,
             "weight_passes": cal.weight_pass_s, "weight_pass_ops": cal.weight_pass_op_s}
    return [cal.scale.get(f, 1.0) if f in OP_KINDS else named[f] for f in FEATURES]


def _stage_sums(model: Model, span: StageSpan, layers: list[LayerCost], policies: list[BlockPolicy]) -> dict[str, float]:
    """Per action kind, the summed phase value of a stage's layers (the re-run forward added to B and
    I; W's extra work under a split backward added to W).

    ``policies`` are the plan's block policies; the re-run part and W's extra are the engine's own
    rules (:func:`mindpipe.simulator.build.stage_recompute`, :func:`~mindpipe.simulator.build.weight_pass_extra`).
    """
    f = sum(c.forward_s for c in layers)
    i = sum(c.backward_input_s for c in layers)
    w = sum(c.backward_weight_s for c in layers)
    re = stage_recompute(layers, [policies[b] for b in span.blocks])[0]
    extra = weight_pass_extra(model, span, layers, policies, True)[0]
    return {"F": f, "B": re + i + w, "I": re + i, "W": w + extra}


def _stage_policies(model: Model, plan: Plan) -> list[list[BlockPolicy]]:
    """The block policies of each virtual stage (:mod:`mindpipe.traces.layout`)."""
    policies = block_policies(plan, model.num_layers)
    return [[policies[b] for b in span.blocks] for span in stage_layout(plan, model)]


def action_features(model: Model, plan: Plan, ref: ReferenceOpTime) -> dict[tuple[int, str], list[float]]:
    """Feature vector (``FEATURES`` order) of every (virtual stage, action kind) of ``plan``."""
    per_feature: list[list[dict[str, float]]] = []
    spans, every = stage_layout(plan, model), block_policies(plan, model.num_layers)
    for feature in OP_FEATURES:

        def price(ops: Sequence[Op], feature: str = feature) -> tuple[float, float, float, float]:
            out = {"forward": 0.0, "backward_input": 0.0, "backward_weight": 0.0}
            core = 0.0
            for op in ops:
                if feature == "ops":
                    v = 0.0 if op.inner else 1.0  # CalibratedComputeModel.op_s: no host overhead of its own
                elif feature == "tp_ops":
                    v = 1.0 if plan.tp > 1 and not op.inner else 0.0
                elif feature == "fresh_bytes":
                    v = ref.fresh_bytes(op)
                else:
                    v = ref(op, plan.precision) if op.kind == feature else 0.0
                out[op.phase] += v
                if op.attention_core and op.phase == "forward":
                    core += v
            return out["forward"], out["backward_input"], out["backward_weight"], core

        stages = assign_layers(op_layer_costs(model, plan, price), model, plan)
        per_feature.append([_stage_sums(model, span, layers, every) for span, layers in zip(spans, stages, strict=True)])
    n_stages = len(per_feature[0])
    colls = action_collectives(model, plan)
    units = [data_parallel_units(plan, span.num_blocks) for span in spans]
    swap = stage_swap_bytes(model, plan, ref.device)
    counts = stage_op_counts(model, plan)
    walks = [split_backward_walks(model, plan, span, c, every) for span, c in zip(spans, counts, strict=True)]
    split = {s: {"I": [walks[s][0], 0.0, 0.0], "W": [0.0, walks[s][1], walks[s][2]]} for s in range(n_stages)}
    out = {(s, kind): [per_feature[k][s][kind] for k in range(len(OP_FEATURES))]
           + [tp_wire_bytes(colls[(s, kind)], plan.tp, backend_of(ref.device)) if plan.tp > 1 else 0.0,
              float(units[s]) if kind != "W" else 0.0, swap[s][kind]] + split[s].get(kind, [0.0, 0.0, 0.0])
           for s in range(n_stages) for kind in ("F", "B", "I", "W")}
    _first_stage_backward_in_w(out, [0.0] * len(FEATURES))
    return out


def stage_swap_bytes(model: Model, plan: Plan, device: DeviceSpec) -> list[dict[str, float]]:
    """Per virtual stage and action kind, the bytes its swapped blocks copy inside the action (CPU).

    On a CPU the executor's swap is a synchronous copy on the rank's thread
    (:mod:`mindpipe.executor.offload`): F copies each swapped block's saved tensors into the pool,
    the backward (B, or I under a split backward) copies them all back, and W copies its GEMMs'
    inputs back again (:func:`mindpipe.simulator.costs.swap_weight_reread_bytes`). The bytes per
    block are the simulator's (:func:`mindpipe.simulator.planning.swap_bytes_per_block`), and the
    swapped blocks per stage the engine's rule (:func:`mindpipe.simulator.build.stage_recompute`).
    On a GPU the copies run on a side stream, outside the actions: all zero.
    """
    n_stages = len(stage_layout(plan, model))
    if device.kind != "cpu":
        return [dict.fromkeys(("F", "B", "I", "W"), 0.0) for _ in range(n_stages)]
    block, reread = swap_bytes_per_block(model, plan), swap_weight_reread_bytes(model, plan)
    out = []
    for layers, pol in zip(stage_structure(model, plan), _stage_policies(model, plan), strict=True):
        n = stage_recompute(layers, pol)[2]
        out.append({"F": n * block, "B": n * block, "I": n * block, "W": n * reread})
    return out


def _first_stage_backward_in_w(table: dict[tuple[int, str], Any], nothing: Any) -> None:
    """Stage 0's I does ``nothing`` and its W is the whole B, as torch runs it (module docstring)."""
    table[(0, "W")], table[(0, "I")] = table[(0, "B")], nothing


def stage_structure(model: Model, plan: Plan) -> list[list[LayerCost]]:
    """The layers of each virtual stage (names, collectives, parameters; times left at zero)."""

    return assign_layers(stage_structure_costs(model, plan), model, plan)


def action_collectives(model: Model, plan: Plan) -> dict[tuple[int, str], list[Collective]]:
    """Tensor-parallel collectives issued inside each (virtual stage, action kind)."""
    stages = stage_structure(model, plan)
    out: dict[tuple[int, str], list[Collective]] = {}
    every = block_policies(plan, model.num_layers)
    for s, (span, layers) in enumerate(zip(stage_layout(plan, model), stages, strict=True)):
        fwd = [c for layer in layers for c in layer.forward_comm]
        bwd = [c for layer in layers for c in layer.backward_comm]
        re = stage_recompute(layers, [every[b] for b in span.blocks])[1]
        out[(s, "F")] = fwd
        out[(s, "B")] = out[(s, "I")] = re + bwd
        out[(s, "W")] = weight_pass_extra(model, span, layers, every, True)[1]
    _first_stage_backward_in_w(out, [])
    return out


class _NoOptimizer:
    """A compute model for :func:`build_work` when only the transfers matter."""

    def optimizer_step_s(self, params_per_device: int, plan: Plan) -> float:
        return 0.0


def rank_host_features(model: Model, plan: Plan, cluster: Cluster, device: DeviceSpec,
                       actions_per_step: dict[int, dict[tuple[int, str], float]]) -> dict[int, list[float]]:
    """``HOST_FEATURES`` per pipeline rank for one iteration (module docstring).

    Args:
        actions_per_step: Per pipeline rank, how many actions of each (virtual stage, kind) it
            ran per iteration (measured, so a torch-built schedule counts as it ran).
    """
    backend = backend_of(device)
    topo = Topology(plan, cluster, device, rank_order=plan.rank_order)
    owner = stage_to_rank(plan)
    split = any(kind in ("I", "W") for per_rank in actions_per_step.values() for _, kind in per_rank)
    stages, ranks, _ = build_work(model, plan, stage_structure_costs(model, plan), _NoOptimizer(), topo,  # type: ignore[arg-type]
                                  owner, split_backward=split)
    last = len(stages) - 1
    ops = {key: row[FEATURES.index("ops")] for key, row in action_features(model, plan, ReferenceOpTime(device)).items()}
    out: dict[int, list[float]] = {}

    def add(acc: list[float], phases: list[Phase] | None, weight: float) -> None:
        for ph in phases or []:
            steps, nbytes = host_terms(ph, backend)
            acc[2] += weight * steps
            acc[3] += weight * nbytes

    for r in range(plan.pp):
        acc = [1.0, 0.0, 0.0, 0.0]
        for (s, kind), n in actions_per_step.get(r, {}).items():
            acc[1] += n * ops[(s, kind)]
            st = stages[s]
            if kind == "F":
                add(acc, st.fwd_tp, n)
                add(acc, st.send_fwd, 0.5 * n)
                if s > 0:
                    add(acc, stages[s - 1].send_fwd, 0.5 * n)
            elif kind in ("B", "I"):
                add(acc, st.bwd_tp, n)
                add(acc, st.send_bwd, 0.5 * n)
                if s < last:
                    add(acc, stages[s + 1].send_bwd, 0.5 * n)
            elif kind == "W":
                add(acc, st.rerun_tp, n)
        for s, st in enumerate(stages):
            if owner[s] == r:
                for phases in st.dp_buckets + st.gather_buckets:
                    add(acc, phases, 1.0)
        for phases in [*ranks[r].param_gather, ranks[r].tied_exchange, ranks[r].partial_grad_reduce]:
            add(acc, phases, 1.0)
        out[r] = acc
    return out


def stage_structure_costs(model: Model, plan: Plan) -> list[LayerCost]:
    """Every layer's structure (collectives, parameters, output bytes) with times left at zero."""

    def zero(ops: Sequence[Op]) -> tuple[float, float, float, float]:
        return 0.0, 0.0, 0.0, 0.0

    return op_layer_costs(model, plan, zero)


def shared_core_rates(actions: list[ActionRecord], slots: float) -> list[float]:
    """Mean full-speed fraction each action ran at, given concurrent actions of all ranks.

    ``slots`` ranks run at full speed at once; with n computing, each gets min(1, slots / n).
    Actions of different steps never overlap (a step ends when every rank has finished).
    """
    rates = [1.0] * len(actions)
    by_step: dict[int, list[int]] = defaultdict(list)
    for idx, a in enumerate(actions):
        by_step[a.step].append(idx)
    for idxs in by_step.values():
        edges = sorted({t for i in idxs for t in (actions[i].start_s, actions[i].start_s + actions[i].duration_s)})
        if len(edges) < 2:
            continue
        # Ranks active in each elementary segment between consecutive edges.
        active = [0] * (len(edges) - 1)
        pos = {t: k for k, t in enumerate(edges)}
        spans = []
        for i in idxs:
            a = actions[i]
            lo, hi = pos[a.start_s], pos[a.start_s + a.duration_s]
            spans.append((i, lo, hi))
            for k in range(lo, hi):
                active[k] += 1
        for i, lo, hi in spans:
            total = edges[hi] - edges[lo]
            if total <= 0:
                continue
            work = sum((edges[k + 1] - edges[k]) * min(1.0, slots / active[k]) for k in range(lo, hi))
            rates[i] = work / total
    return rates


__all__ = [
    "FEATURES",
    "HOST_FEATURES",
    "OP_FEATURES",
    "action_collectives",
    "action_features",
    "constants",
    "rank_host_features",
    "shared_core_rates",
    "stage_structure",
    "stage_structure_costs",
    "stage_swap_bytes",
]
