"""Turn a search point into a runnable plan: per-layer costs, the partition, the memory check.

Runs inside the evaluation workers. The partition is computed here and written into the plan, so
the simulator (and later the executor, from ``best_plan.json``) use the same split. The memory
check is :func:`mindpipe.simulator.memory.stage_memory` — the simulator's own model — evaluated before the
(much more expensive) event simulation, so plans that cannot fit are filtered without simulating.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from mindpipe.simulator.api import default_models
from mindpipe.simulator.calibrate.models import apply_calibration
from mindpipe.simulator.costs import DTYPE_BYTES, ComputeModel, LayerCost, TraceComputeModel, layer_params
from mindpipe.simulator.memory import (
    GPU_RESERVED_BYTES,
    RankMemory,
    activation_bytes_per_layer,
    embedding_activation_bytes,
    head_activation_bytes,
    model_state_bytes,
    stage_memory,
)
from mindpipe.simulator.schedules import build_schedule
from mindpipe.traces.calibration import Calibration
from mindpipe.traces.catalog import DeviceSpec, get_device
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.trace import Trace
from mindpipe.tuner.partition import link_bandwidths, make_partition
from mindpipe.tuner.space import POINT_KEYS, Point

_COSTS: OrderedDict[tuple[Any, ...], list[LayerCost]] = OrderedDict()
_COST_CACHE_SIZE = 256


@dataclass
class Problem:
    """What every evaluation needs besides the point (pickled to each worker).

    Attributes:
        model, cluster: What is planned.
        trace: Per-layer trace for the compute model (None: the hardware model).
        pinned: Plan list keys pinned by ``--fix`` (``partition``, ``layer_memory_policy``).
        memory_caps: Let the ``balanced`` partitioner cap blocks per stage by memory.
        fingerprint: Identity of (model, cluster, trace) for the workers' cost cache.
        calibration: Constants fitted from measured runs (``mindpipe calibrate``), or None.
    """

    model: Model
    cluster: Cluster
    trace: Trace | None = None
    pinned: dict[str, list[Any]] | None = None
    memory_caps: bool = True
    fingerprint: str = ""
    calibration: Calibration | None = None

    @property
    def device(self) -> DeviceSpec:
        """The cluster's catalog device."""
        return get_device(self.cluster.gpu)

    def compute_model(self) -> ComputeModel:
        """The compute model :func:`mindpipe.simulator.api.simulate` uses for this problem."""
        hw, comm = default_models(self.device, self.cluster)
        if self.calibration is not None:
            hw = apply_calibration(self.calibration, self.device, self.cluster, hw, comm).compute or hw
        return TraceComputeModel(self.trace, fallback=hw) if self.trace is not None else hw


def layer_costs(problem: Problem, plan: Plan) -> list[LayerCost]:
    """Per-layer costs under ``plan``, cached on the fields that change them."""
    key = (problem.fingerprint or id(problem), problem.model.label, problem.cluster.gpu, plan.tp, plan.micro_batch_size,
           plan.sequence_parallel, plan.precision)
    if key not in _COSTS:
        _COSTS[key] = problem.compute_model().layer_costs(problem.model, plan)
        if len(_COSTS) > _COST_CACHE_SIZE:
            _COSTS.popitem(last=False)
    return _COSTS[key]


def base_plan(problem: Problem, point: Point, partition: list[int] | None = None) -> Plan:
    """The plan of a point, without or with a partition."""
    kwargs: dict[str, Any] = {k: point[k] for k in POINT_KEYS if k != "partitioner"}
    for key, value in (problem.pinned or {}).items():
        kwargs[key] = list(value)
    if partition is not None:
        kwargs["partition"] = list(partition)
    return Plan(**kwargs)


def memory_caps(model: Model, plan: Plan, device: DeviceSpec, in_flight: list[list[int]]) -> list[int] | None:
    """Most blocks each stage can hold in device memory (one stage per rank), or None.

    Mirrors :func:`mindpipe.simulator.memory.stage_memory` for one stage per rank, as an affine function
    of the block count n: model states of (extras + n blocks), in-flight micro-batches × (n ×
    per-block activations + embedding/head extras), a transient block under full recompute, the
    framework reserve. Several chunks per rank couple stages, so no caps there (the memory check
    after partitioning still filters).
    """
    if plan.virtual_stages != 1 or plan.layer_memory_policy is not None:
        return None
    params = {kind: n for _, kind, n in layer_params(model, plan.tp)}
    per_param = sum(model_state_bytes(1.0, plan))
    mask = DTYPE_BYTES[plan.precision] if device.kind == "cpu" else None  # as stage_memory
    act = activation_bytes_per_layer(model, plan, mask_bytes=mask)
    transient = activation_bytes_per_layer(model, plan, policy="keep", mask_bytes=mask) if plan.recompute == "full" else 0.0
    reserve = 0.0 if device.kind == "cpu" else GPU_RESERVED_BYTES
    cap = float(device.memory_capacity_bytes)
    out = []
    last = plan.pp - 1
    for s in range(plan.pp):
        k = in_flight[s][0]
        fixed_params, fixed_act = 0.0, 0.0
        if s == 0:
            fixed_params += params["embedding"]
            fixed_act += embedding_activation_bytes(model, plan, mask_bytes=mask)
        if s == last:
            fixed_params += params["final_norm"] + params["lm_head"]
            fixed_act += head_activation_bytes(model, plan)
        room = cap - reserve - transient - fixed_params * per_param - k * fixed_act
        per_block = params["block"] * per_param + k * act
        out.append(max(0, int(room // per_block)) if per_block > 0 else model.num_layers)
    return out


@dataclass
class Materialized:
    """A point made concrete: the plan with its partition and the memory verdict."""

    plan: Plan
    memory: list[RankMemory]

    @property
    def fits(self) -> bool:
        """True when every pipeline rank fits in device memory."""
        return all(rm.fits for rm in self.memory)

    @property
    def peak_memory_gib(self) -> float:
        """Largest per-rank total, GiB."""
        return max(rm.total_bytes for rm in self.memory) / 2**30


def materialize(problem: Problem, point: Point) -> Materialized:
    """Partition the point's plan by its partitioner and check its memory.

    Raises:
        ContractError: the point breaks a plan rule (should not happen for points of a space).
    """
    model, device = problem.model, problem.device
    plan = base_plan(problem, point)
    schedule = build_schedule(plan.schedule, plan.pp, plan.num_microbatches, plan.virtual_stages)
    name = point["partitioner"]
    if plan.num_stages == 1:
        partition = [model.num_layers]
    else:
        costs = layer_costs(problem, plan) if name in ("balanced", "pipedream") else []
        caps = None
        if name == "balanced" and problem.memory_caps:
            caps = memory_caps(model, plan, device, schedule.in_flight_peak())
        try:
            partition = make_partition(name, costs, plan, num_layers=model.num_layers,
                                       stage_to_rank=schedule.stage_to_rank,
                                       bandwidths=link_bandwidths(plan, problem.cluster, device), caps=caps)
        except ContractError:
            if caps is None:
                raise
            # No split fits under the caps: balance time alone; the memory check reports the overflow.
            partition = make_partition(name, costs, plan, num_layers=model.num_layers,
                                       stage_to_rank=schedule.stage_to_rank)
    plan = base_plan(problem, point, partition)
    memory = stage_memory(model, plan, device, schedule, list(partition))
    return Materialized(plan, memory)


__all__ = ["Materialized", "Problem", "base_plan", "layer_costs", "materialize", "memory_caps"]
