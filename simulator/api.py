"""``simulate(model, cluster, plan)``: the simulator's one entry point (the ``simulate`` contract).

Assembles the pieces — compute costs (trace or hardware model), the schedule's action lists,
placement and links, the event-driven engine, the memory model, energy and carbon — into the
:class:`~mindpipe.traces.result.SimulationResult` of DESIGN.md.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from mindpipe.simulator.build import build_work
from mindpipe.simulator.calibrate.models import apply_calibration
from mindpipe.simulator.costs import (
    DTYPE_BYTES,
    AlphaBetaCommModel,
    CommModel,
    ComputeModel,
    RooflineComputeModel,
    TraceComputeModel,
)
from mindpipe.simulator.energy import annual_intensity, energy_report, hourly_intensity
from mindpipe.simulator.engine import Engine, EngineOptions, EngineResult
from mindpipe.simulator.memory import activation_bytes_per_layer, stage_memory
from mindpipe.simulator.network import FluidNetwork, Transfers
from mindpipe.simulator.ops import model_flops_per_iteration
from mindpipe.simulator.perf import default_models as gpu_default_models
from mindpipe.simulator.schedules import build_schedule
from mindpipe.simulator.topology import Topology
from mindpipe.traces.calibration import Calibration
from mindpipe.traces.catalog import DeviceSpec, get_device
from mindpipe.traces.config import Cluster, Model, Plan, check_plan, stage_layers
from mindpipe.traces.result import SimulationResult
from mindpipe.traces.trace import Trace

GIB = 2**30


@dataclass
class SimulationOptions:
    """Optional inputs of :func:`simulate`.

    Attributes:
        trace: Per-layer costs to use instead of the hardware model.
        compute: A compute model (overrides ``trace`` and the default).
        comm: A communication model (default: the device's fitted or α-β model).
        timeline: Return every compute action and transfer in ``result.timeline``.
        cores_per_rank_slots: CPU ranks sharing cores (see EngineOptions); from calibration.
        step_overhead_s: Host time per iteration outside the schedule (see EngineOptions).
        hourly_intensity: An Electricity Maps hourly series and the start time of the iteration,
            instead of the region's annual mean.
        catalog: A device catalog to look the cluster's device up in (default: shipped).
        calibration: Constants fitted from measured runs (``mindpipe calibrate``): calibrated
            compute (unless ``compute`` or ``trace`` is given) and communication (unless ``comm``
            is given), CPU core sharing and the per-iteration overhead.
    """

    trace: Trace | None = None
    compute: ComputeModel | None = None
    comm: CommModel | None = None
    timeline: bool = False
    cores_per_rank_slots: float | None = None
    step_overhead_s: float = 0.0
    hourly_intensity: tuple[list[tuple[dt.datetime, float]], dt.datetime] | None = None
    catalog: dict[str, DeviceSpec] | None = None
    calibration: Calibration | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def default_models(device: DeviceSpec, cluster: Cluster | None = None) -> tuple[ComputeModel, CommModel]:
    """The hardware models used when no trace is given.

    GPUs: the shape-aware kernel model and the NCCL model of :mod:`mindpipe.simulator.perf` (constants per
    GPU family, fitted on published A100 measurements; ``mindpipe validate`` reports their error).
    CPUs: the roofline and an α-β comm model (gloo), which calibration refits.
    """
    if device.kind == "gpu":
        return gpu_default_models(device, cluster)
    return RooflineComputeModel(device), AlphaBetaCommModel()


def simulate(model: Model, cluster: Cluster, plan: Plan, options: SimulationOptions | None = None) -> SimulationResult:
    """Predict one training iteration of ``model`` on ``cluster`` under ``plan``.

    Raises:
        ContractError: the plan does not fit the model or the cluster (names key and rule).
    """
    opts = options or SimulationOptions()
    check_plan(plan, model, cluster)
    device = get_device(cluster.gpu, opts.catalog)
    hw_compute, hw_comm = default_models(device, cluster)
    slots, overhead = opts.cores_per_rank_slots, opts.step_overhead_s
    step_host = 0.0
    notes: list[str] = []
    if opts.calibration is not None:
        applied = apply_calibration(opts.calibration, device, cluster, hw_compute, hw_comm)
        if device.name in opts.calibration.devices and plan.precision not in opts.calibration.devices[device.name].compute:
            applied.notes.append(f"no compute calibration for {device.name} at {plan.precision}; uncalibrated compute")
        cluster, notes = applied.cluster, applied.notes
        hw_compute = applied.compute or hw_compute
        hw_comm = applied.comm or hw_comm
        slots = slots if slots is not None else applied.cores_per_rank_slots
        overhead = overhead or applied.step_overhead_s
        step_host = applied.step_cpu_s
    compute: ComputeModel
    if opts.compute is not None:
        compute = opts.compute
    elif opts.trace is not None:
        compute = TraceComputeModel(opts.trace, fallback=hw_compute)
    else:
        compute = hw_compute
    comm = opts.comm or hw_comm
    m = plan.num_microbatches
    schedule = build_schedule(plan.schedule, plan.pp, m, plan.virtual_stages)
    topo = Topology(plan, cluster, device, rank_order=plan.rank_order)
    costs = compute.layer_costs(model, plan)
    swap_bytes = activation_bytes_per_layer(model, plan, policy="keep")
    stages, ranks, params_by_rank = build_work(model, plan, costs, compute, topo, schedule.stage_to_rank,
                                               swap_bytes_per_block=lambda: swap_bytes)

    def factory(env):
        net = FluidNetwork(env, _capacity(topo, slots))
        return net, Transfers(env, net, topo, comm)

    eng_opts = EngineOptions(
        overlap_grad_reduce=plan.overlap_grad_reduce,
        pp_first=plan.comm_priority == "pp_first",
        cores_per_rank_slots=slots,
        step_overhead_s=overhead,
        # gloo between the ranks of one CPU host copies through loopback on those same cores.
        comm_on_cores=slots is not None and device.kind == "cpu" and cluster.num_nodes == 1,
        step_host_s=step_host,
        record=opts.timeline,
    )
    res = Engine(schedule, stages, ranks, factory, eng_opts).run()
    result = _result(model, cluster, plan, device, schedule, res, params_by_rank, compute, opts)
    if opts.calibration is not None:
        result.extra["calibration"] = {"applied": True, "notes": notes, "cores_per_rank_slots": slots,
                                       "step_overhead_s": overhead, "step_host_cpu_s": step_host,
                                       "transfers_on_cores": eng_opts.comm_on_cores}
    return result


def _capacity(topo: Topology, slots: float | None):
    def cap(link: Any) -> float:
        if link[0] == "cores":
            return float(slots or 1.0)
        return topo.link_capacity(link)

    return cap


def _result(model: Model, cluster: Cluster, plan: Plan, device: DeviceSpec, schedule, res: EngineResult,
            params_by_rank: list[int], compute: ComputeModel, opts: SimulationOptions) -> SimulationResult:
    t = res.iteration_time_s
    world = plan.world_size
    gbs, s = plan.global_batch_size, model.seq_len
    flops = model_flops_per_iteration(model, gbs)
    peak = device.peak_flops(plan.precision)
    mem = stage_memory(model, plan, device, schedule, stage_layers(plan, model))
    by_stage = [rm.total_bytes / GIB for rm in mem]
    if opts.hourly_intensity is not None:
        series, when = opts.hourly_intensity
        intensity = (hourly_intensity(series, when), f"hourly series at {when.isoformat()}")
    else:
        intensity = annual_intensity(cluster.region)
    busy = [c for c in res.compute_s]
    energy = energy_report(device, t, busy, plan.dp * plan.tp, cluster.pue, intensity)
    extra: dict[str, Any] = {
        "schedule": schedule.name,
        "num_microbatches": plan.num_microbatches,
        "pipeline_time_s": res.pipeline_time_s,
        "exposed_dp_comm_s": max(res.exposed_dp_s) if res.exposed_dp_s else 0.0,
        "rank_end_s": res.end_s,
        "rank_compute_s": res.compute_s,
        "rank_tp_comm_s": res.comm_busy_s,
        "params_per_device_by_rank": params_by_rank,
        "model_flops_per_iteration": flops,
        "bytes_by_link_type": res.bytes_by_link_type,
        "device_energy_j": energy.device_energy_j,
        "carbon_intensity_g_per_kwh": energy.intensity_g_per_kwh,
        "carbon_intensity_source": energy.intensity_source,
        "compute_model": type(compute).__name__,
        "memory_by_stage": [
            {k: getattr(rm, k) for k in ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
                                         "other_bytes", "total_bytes")} for rm in mem
        ],
        "precision_bytes": DTYPE_BYTES[plan.precision],
    }
    if isinstance(compute, TraceComputeModel) and compute.scaled(plan):
        extra["warning"] = (
            f"trace taken at micro_batch_size={compute.trace.micro_batch_size}, tp={compute.trace.tp}; "
            f"times scaled linearly to micro_batch_size={plan.micro_batch_size}, tp={plan.tp}"
        )
    extra.update(opts.extra)
    timeline = None
    if res.timeline is not None:
        timeline = [{"rank": e.rank, "thread": e.thread, "name": e.name, "start_s": e.start, "end_s": e.end,
                     "category": e.category} for e in res.timeline]
    return SimulationResult(
        iteration_time_s=t,
        throughput_samples_per_s=gbs / t,
        throughput_tokens_per_s=gbs * s / t,
        tflops_per_gpu=flops / t / world / 1e12,
        mfu=flops / (t * world * peak),
        bubble_fraction=res.bubble_fraction,
        memory_by_stage_gib=by_stage,
        peak_memory_gib=max(by_stage),
        fits_in_memory=all(rm.fits for rm in mem),
        energy_j=energy.facility_energy_j,
        carbon_gco2=energy.carbon_gco2,
        timeline=timeline,
        extra=extra,
    )


__all__ = ["SimulationOptions", "default_models", "simulate"]
