"""The :class:`Simulator`: built once from (model, cluster, trace, calibration), asked per plan.

It owns everything a simulation needs that does not depend on the plan — the catalog device, the
compute and communication models (hardware models, a trace, a calibration on top), the cluster as
calibration sees it, the CPU core sharing and host overheads — and answers, per plan:

* :meth:`~Simulator.layer_costs` — per-layer costs (cached on the plan fields that change them);
* :meth:`~Simulator.memory` and :meth:`~Simulator.block_caps` — per-rank memory and per-stage
  block caps (:mod:`mindpipe.simulator.memory`);
* :meth:`~Simulator.topology` and :meth:`~Simulator.link_bandwidths` — placement, links and the
  bandwidths a pipeline send and a data-parallel reduction get;
* :meth:`~Simulator.run` — the event-driven simulation of one iteration (a
  :class:`~mindpipe.traces.result.SimulationResult`).

The tuner builds one per sweep (per worker process), calibration and the demo one per measured
setup, the CLI's ``simulate`` and ``run`` one per command; :func:`mindpipe.simulator.api.simulate`
is a thin wrapper for a single plan. Nobody re-derives these pieces.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from mindpipe.simulator.actions import Schedule
from mindpipe.simulator.build import build_work
from mindpipe.simulator.calibrate.models import apply_calibration
from mindpipe.simulator.carbon import Hourly, stamp
from mindpipe.simulator.costs import (
    DTYPE_BYTES,
    CommModel,
    ComputeModel,
    LayerCost,
    TraceComputeModel,
    cpu_copy_s,
    swap_weight_reread_bytes,
)
from mindpipe.simulator.energy import EnergyReport, annual_intensity, energy_report, hourly_intensity
from mindpipe.simulator.engine import Engine, EngineOptions, EngineResult, RankWork, StageWork
from mindpipe.simulator.frequency import (
    PowerModel,
    StageClockTable,
    action_busy_power_w,
    apply_action_clocks,
    apply_clocks,
    build_clock_table,
    hardware_stage_times,
    rank_busy_power_w,
)
from mindpipe.simulator.memory import RankMemory, memory_by_action, stage_memory
from mindpipe.simulator.network import FluidNetwork, Transfers
from mindpipe.simulator.ops import model_flops_per_iteration
from mindpipe.simulator.perf import default_models
from mindpipe.simulator.perf.gpu import GpuComputeModel
from mindpipe.simulator.planning import StageBudget, block_caps, stage_budgets, swap_bytes_per_block
from mindpipe.simulator.schedules import build_schedule
from mindpipe.simulator.topology import Topology
from mindpipe.simulator.work import StepCopies
from mindpipe.traces.calibration import Calibration, ComputeCalibration
from mindpipe.traces.catalog import DeviceSpec, get_device
from mindpipe.traces.config import Cluster, Model, Plan, check_plan, stage_layers
from mindpipe.traces.errors import ContractError
from mindpipe.traces.frequency import flat_action_clocks, frequency_spec, has_frequency_data
from mindpipe.traces.result import GIB, CalibrationUse, SimulationDetails, SimulationResult
from mindpipe.traces.trace import Trace

# Plan fields that change per-layer costs (micro-batch shape, sharding, dtype, how K/V are exchanged);
# the cost cache key. Every Plan field a compute model reads must be here, or one plan's costs are
# served to another (tests/simulator/test_cost_cache_key.py checks it).
COST_FIELDS = ("tp", "cp", "micro_batch_size", "sequence_parallel", "precision", "tp_comm_overlap", "flash_attention",
               "loss_chunks", "fused_head_loss", "cp_comm_type", "fused_elementwise")


@dataclass(frozen=True)
class SimulationNotes:
    """What :meth:`Simulator.run` knows beside the engine's result: the clocks priced and each rank's
    busy power under them, why clocks were not priced, and what a calibration applied."""

    stage_clocks_mhz: list[int] | None
    rank_busy_power_w: list[float] | None
    stage_clocks_note: str | None
    calibration: CalibrationUse | None


@dataclass
class HostModel:
    """How a calibrated CPU host behaves outside the device models (see :class:`EngineOptions`).

    Attributes:
        cores_per_rank_slots: Ranks the host's cores run at full speed at once (None: dedicated devices).
        step_overhead_s: Wall time per iteration outside the schedule and the optimizer.
        step_host_s: Host CPU time per iteration on the shared cores, after the optimizer.
        notes: What the calibration did and did not cover.
    """

    cores_per_rank_slots: float | None = None
    step_overhead_s: float = 0.0
    step_host_s: float = 0.0
    notes: list[str] = field(default_factory=list)


class Simulator:
    """Simulations of many plans of one (model, cluster) under one set of models (module docstring).

    Args:
        model, cluster: What is simulated.
        trace: Per-layer costs to use instead of the hardware compute model.
        calibration: Constants fitted from measured runs (``mindpipe calibrate``): calibrated compute
            (unless ``compute`` or ``trace`` is given) and communication (unless ``comm`` is given),
            CPU core sharing and the host overheads.
        compute: A compute model (overrides ``trace`` and the default).
        comm: A communication model (default: the device's, or the calibration's).
        catalog: A device catalog to look the cluster's device up in (default: shipped).
        cores_per_rank_slots: Overrides the calibration's CPU core sharing.
        step_overhead_s: Overrides the calibration's per-iteration overhead (when non-zero).
    """

    def __init__(self, model: Model, cluster: Cluster, *, trace: Trace | None = None,
                 calibration: Calibration | None = None, compute: ComputeModel | None = None,
                 comm: CommModel | None = None, catalog: dict[str, DeviceSpec] | None = None,
                 cores_per_rank_slots: float | None = None, step_overhead_s: float = 0.0) -> None:
        self.model = model
        device = get_device(cluster.gpu, catalog)
        # A CPU cluster's "devices" are ranks on its nodes' hosts, sharing each host's RAM: every
        # memory answer (fits, caps, planners' budgets) is per rank, the host's RAM over its ranks.
        self.ranks_per_device = cluster.gpus_per_node if device.kind == "cpu" else 1
        self.device_capacity_bytes = device.memory_capacity_bytes
        self.device = device if self.ranks_per_device == 1 else dataclasses.replace(
            device, memory_capacity_bytes=device.memory_capacity_bytes // self.ranks_per_device)
        if trace is not None:  # a trace prices only the model it was taken for (simulate(), tune_max_batch(), ...)
            trace.check_model(model, source="trace")
        self.trace = trace
        self.calibration = calibration
        hw_compute, hw_comm = default_models(self.device, cluster)
        self._kernels = hw_compute if isinstance(hw_compute, GpuComputeModel) else None  # prices copies
        host = HostModel(cores_per_rank_slots, step_overhead_s)
        if calibration is not None:
            applied = apply_calibration(calibration, self.device, cluster, hw_compute, hw_comm)
            cluster = applied.cluster
            hw_compute = applied.compute or hw_compute
            hw_comm = applied.comm or hw_comm
            host = HostModel(cores_per_rank_slots if cores_per_rank_slots is not None else applied.cores_per_rank_slots,
                             step_overhead_s or applied.step_overhead_s, applied.step_cpu_s, applied.notes)
        self.cluster = cluster
        self.host = host
        self.compute: ComputeModel = compute or (TraceComputeModel(trace, fallback=hw_compute) if trace is not None
                                                 else hw_compute)
        self.comm: CommModel = comm or hw_comm
        self._costs: dict[tuple[Any, ...], list[LayerCost]] = {}
        self._clocked: dict[tuple[str, int], list[tuple[float, float]]] = {}
        self.power = PowerModel.of(self.device) if has_frequency_data(self.device.name) else None

    # -- plan-level answers ------------------------------------------------------------------
    def check(self, plan: Plan, source: str = "plan") -> None:
        """Raise a ContractError unless ``plan`` fits the model and the cluster."""
        check_plan(plan, self.model, self.cluster, source=source)

    def schedule(self, plan: Plan) -> Schedule:
        """The plan's schedule (per-rank action lists)."""
        return build_schedule(plan.schedule, plan.pp, plan.num_microbatches, plan.virtual_stages)

    def layer_costs(self, plan: Plan) -> list[LayerCost]:
        """Per-layer costs under ``plan`` (shared, read-only: cached on :data:`COST_FIELDS`)."""
        key = tuple(getattr(plan, k) for k in COST_FIELDS)
        costs = self._costs.get(key)
        if costs is None:
            costs = self._costs[key] = self.compute.layer_costs(self.model, plan)
        return costs

    def memory(self, plan: Plan, reserved_bytes: float | None = None) -> list[RankMemory]:
        """Peak memory of every pipeline rank (:func:`mindpipe.simulator.memory.stage_memory`;
        ``reserved_bytes`` replaces the framework overhead it adds on a GPU)."""
        return stage_memory(self.model, plan, self.device, self.schedule(plan), stage_layers(plan, self.model),
                            reserved_bytes=reserved_bytes)

    def memory_by_action(self, plan: Plan, reserved_bytes: float | None = None) -> list[list[float]]:
        """Per pipeline rank, per action of its order (:meth:`schedule`), the device bytes at their
        peak while it runs (:func:`mindpipe.simulator.memory.memory_by_action`; ``reserved_bytes`` as
        in :meth:`memory`)."""
        return memory_by_action(self.model, plan, self.device, self.schedule(plan), stage_layers(plan, self.model),
                                reserved_bytes=reserved_bytes)

    def refuse_unless_fits(self, plan: Plan, ranks_per_device: int | None = None, source: str = "plan") -> list[float]:
        """Per-rank peak memory in GiB; raise when a rank (times the ranks sharing its device) does not fit.

        ``ranks_per_device`` ranks share one device's memory (CPU ranks on one host share its RAM);
        None: the cluster's (:attr:`ranks_per_device`: a CPU node's ranks, else 1).

        Raises:
            ContractError: naming the rank, the estimate with its parts, and the device's capacity.
        """
        ranks = self.memory(plan)
        share = self.ranks_per_device if ranks_per_device is None else max(1, ranks_per_device)
        whole = self.device_capacity_bytes
        for r in ranks:
            if r.total_bytes * share > whole:
                g = r.gib()
                shared = f" × {share} ranks sharing it" if share > 1 else ""
                digits = 2  # enough digits that the need and the capacity do not print as one number
                while digits < 6 and f"{r.total_gib * share:.{digits}f}" == f"{whole / GIB:.{digits}f}":
                    digits += 1
                raise ContractError(source, None, (
                    f"pipeline rank {r.rank} needs an estimated {r.total_gib:.{digits}f} GiB{shared} (simulator memory "
                    f"model: weights {g['weights_gib']:.2f}, gradients {g['gradients_gib']:.2f}, optimizer "
                    f"{g['optimizer_gib']:.2f}, activations {g['activations_gib']:.2f}, other {g['other_gib']:.2f}) "
                    f"but {self.device.name} has {whole / GIB:.{digits}f} GiB; raise pp, tp or zero_stage, "
                    "recompute, or lower micro_batch_size"))
            if not r.fits_host and r.host_capacity_bytes is not None:  # (fits_host: a known host)
                raise ContractError(source, None, (
                    f"pipeline rank {r.rank} swaps an estimated {r.host_bytes / GIB:.2f} GiB of activations to host "
                    f"memory, but {self.device.name}'s host has {r.host_capacity_bytes / GIB:.2f} GiB per device; "
                    "swap fewer blocks (recompute them), or lower micro_batch_size"))
        return [r.total_gib for r in ranks]

    def block_caps(self, plan: Plan) -> list[int] | None:
        """Most blocks each stage can hold (:func:`mindpipe.simulator.planning.block_caps`)."""
        return block_caps(self.model, plan, self.device, self.schedule(plan))

    def stage_budgets(self, plan: Plan) -> list[StageBudget]:
        """Per-stage memory as a function of block policies (:func:`mindpipe.simulator.planning.stage_budgets`)."""
        return stage_budgets(self.model, plan, self.device, self.schedule(plan))

    def swap_bytes_per_block(self, plan: Plan) -> float:
        """Bytes a swapped block copies each way per micro-batch (what :meth:`run` copies)."""
        return swap_bytes_per_block(self.model, plan)

    def swap_reread_bytes_per_block(self, plan: Plan) -> float:
        """Bytes a split backward's W copies back again per swapped block, on the host link of a GPU
        rank (:func:`mindpipe.simulator.costs.swap_weight_reread_bytes`; :attr:`StageWork.swap_weight_in`):
        0 when the schedule does not split the backward, and on a CPU, whose copies are on the
        rank's thread (:meth:`_swap_on_compute`)."""
        if self.device.kind == "cpu" or not self.schedule(plan).split_backward:
            return 0.0
        return swap_weight_reread_bytes(self.model, plan)

    def swap_copy_s(self, plan: Plan, nbytes: float) -> float:
        """Time of a host copy of ``nbytes`` alone on pipeline rank 0's host link, as the engine prices it.

        On a CPU the copy is synchronous on the rank's thread (:func:`mindpipe.simulator.costs.cpu_copy_s`,
        calibrated when the calibration fitted runs that swap).
        """
        if nbytes <= 0:
            return 0.0
        if self.device.kind == "cpu":
            return cpu_copy_s(self.device, nbytes, self._swap_s_per_byte(plan))
        topo = self.topology(plan)
        # Only the topology and the comm model price a phase alone; no event loop is needed.
        return Transfers(None, None, topo, self.comm).time_alone(topo.swap(0, nbytes))  # type: ignore[arg-type]

    def clock_table(self, plan: Plan, clocks: set[int] | list[int]) -> StageClockTable:
        """Per stage and clock, the compute stretch and compute-bound share (:mod:`mindpipe.simulator.frequency`).

        Hardware-model stage times are cached per plan layout and clock; the table always holds
        the maximum and minimum clocks, which fix each phase's compute/memory split.

        Raises:
            ContractError: the device has no frequency data.
        """
        spec = frequency_spec(self.device.name)
        key = json.dumps({k: v for k, v in dataclasses.asdict(plan).items() if k not in ("stage_clocks_mhz", "action_clocks_mhz", "made_for")},
                         sort_keys=True)
        wanted = {spec.max_sm_clock_MHz, spec.min_sm_clock_MHz, *clocks}
        times = {}
        for mhz in wanted:
            got = self._clocked.get((key, mhz))
            if got is None:
                got = self._clocked[(key, mhz)] = hardware_stage_times(self.model, plan, self.device, self.cluster, mhz,
                                                                       spec)
            times[mhz] = got
        return build_clock_table(times, spec.max_sm_clock_MHz)

    def stage_clocks(self, plan: Plan) -> list[int] | None:
        """The clock of every stage (the plan's, else the device's default), or None without clock data."""
        if plan.stage_clocks_mhz is not None:
            return list(plan.stage_clocks_mhz)
        if self.power is None:
            return None
        return [self.power.spec.default_sm_clock_MHz] * plan.num_stages

    def topology(self, plan: Plan) -> Topology:
        """Placement of the plan's ranks on the cluster, and its links."""
        return Topology(plan, self.cluster, self.device, rank_order=plan.rank_order)

    def link_bandwidths(self, plan: Plan) -> tuple[float, float]:
        """(pipeline send, data-parallel ring) bytes/s per device under the plan's placement.

        The links a send between the representatives of pipeline ranks 0 and 1 crosses, and the
        slowest link of pipeline rank 0's data-parallel ring (the node's NIC shared by its devices
        when the ring spans nodes): cluster overrides and ``rank_order`` included.
        """
        topo = self.topology(plan)
        p2p = topo.p2p_bandwidth_Bps(0, 1) if plan.pp > 1 else 0.0
        return p2p, topo.group_bandwidth_Bps("dp", 0) if plan.grad_replicas > 1 else 0.0

    # -- simulation ----------------------------------------------------------------------------
    def work(self, plan: Plan) -> tuple[Schedule, Topology, list[StageWork], list[RankWork], list[int]]:
        """What :meth:`run` hands the engine at default clocks: schedule, placement, per-stage and
        per-rank work (:func:`mindpipe.simulator.build.build_work`) and parameters per rank."""
        schedule = self.schedule(plan)
        topo = self.topology(plan)
        swap = swap_bytes_per_block(self.model, plan)
        stages, ranks, params_by_rank = build_work(self.model, plan, self.layer_costs(plan), self.compute, topo,
                                                   schedule.stage_to_rank, swap_bytes_per_block=swap,
                                                   dp_unit_s=self._dp_unit_s(plan),
                                                   swap_on_compute=self._swap_on_compute(plan, schedule, swap),
                                                   split_backward=schedule.split_backward,
                                                   copy_s_per_byte=self._copy_s_per_byte(plan),
                                                   swap_block_copy_s=self._swap_block_copy_s(plan, swap),
                                                   swap_reread_bytes_per_block=self.swap_reread_bytes_per_block(plan)
                                                   if "swap" in (plan.layer_memory_policy or []) else 0.0,
                                                   split_host_s=self._split_host_s(plan))
        return schedule, topo, stages, ranks, params_by_rank

    def _swap_block_copy_s(self, plan: Plan, swap: float) -> float:
        """One swapped block's copy alone on a GPU rank's host link (0 without swap, and on a CPU,
        whose copies are on the rank's thread)."""
        if self.device.kind == "cpu" or "swap" not in (plan.layer_memory_policy or []):
            return 0.0
        return self.swap_copy_s(plan, swap)

    def run(self, plan: Plan, *, timeline: bool = False,
            hourly: Hourly | None = None) -> SimulationResult:
        """Simulate one iteration of ``plan``.

        Args:
            plan: The plan (checked against the model and the cluster).
            timeline: Return every compute action and transfer in ``result.timeline``.
            hourly: An hourly carbon-intensity series and the iteration's start time, instead of
                the region's annual mean.

        Raises:
            ContractError: the plan does not fit the model or the cluster (names key and rule).
        """
        self.check(plan)
        schedule, topo, stages, ranks, params_by_rank = self.work(plan)
        clocks = self.stage_clocks(plan)
        busy_w = None
        if plan.action_clocks_mhz is not None and self.power is not None:
            # Perseus's plan: a clock per forward/backward of each micro-batch.
            table = self.clock_table(plan, set(flat_action_clocks(plan.action_clocks_mhz)))
            apply_action_clocks(stages, table, plan.action_clocks_mhz)
            copies = StepCopies.of(stages, schedule.orders, plan.overlap_grad_reduce)
            busy_w = action_busy_power_w(stages, table, plan.action_clocks_mhz, schedule.stage_to_rank, self.power, plan.pp,
                                         copies)
            clocks = None
        elif clocks is not None and self.power is not None:
            table = self.clock_table(plan, set(clocks))
            apply_clocks(stages, table, clocks)
            busy_w = rank_busy_power_w(stages, table, clocks, schedule.stage_to_rank, self.power, plan.pp,
                                       schedule.num_microbatches,
                                       StepCopies.of(stages, schedule.orders, plan.overlap_grad_reduce))
        host = self.host
        comm = self.comm

        def network(env: Any) -> tuple[FluidNetwork, Transfers]:
            def capacity(link: Any) -> float:
                return float(host.cores_per_rank_slots or 1.0) if link[0] == "cores" else topo.link_capacity(link)

            net = FluidNetwork(env, capacity)
            return net, Transfers(env, net, topo, comm)

        opts = EngineOptions(
            overlap_grad_reduce=plan.overlap_grad_reduce,
            overlap_param_gather=plan.overlap_param_gather,
            pp_first=plan.comm_priority == "pp_first",
            cores_per_rank_slots=host.cores_per_rank_slots,
            step_overhead_s=host.step_overhead_s,
            # gloo between the ranks of one CPU host copies through loopback on those same cores.
            comm_on_cores=(host.cores_per_rank_slots is not None and self.device.kind == "cpu"
                           and self.cluster.num_nodes == 1),
            step_host_s=host.step_host_s,
            record=timeline,
            blocking_p2p=plan.blocking_p2p,
        )
        res = Engine(schedule, stages, ranks, network, opts).run()
        clock_note = None
        if busy_w is None and (plan.stage_clocks_mhz is not None or plan.action_clocks_mhz is not None):
            key = "stage_clocks_mhz" if plan.action_clocks_mhz is None else "action_clocks_mhz"
            clock_note = f"{key} not modelled: {self.device.name} has no frequency data"
        cal = None
        if self.calibration is not None:
            cal = CalibrationUse(self._calibration_notes(plan), host.cores_per_rank_slots, host.step_overhead_s,
                                 host.step_host_s, opts.comm_on_cores)
        notes = SimulationNotes(clocks if busy_w is not None else None, busy_w, clock_note, cal)
        return self._result(plan, schedule, res, params_by_rank, hourly, notes)

    def _fitted_compute(self, plan: Plan) -> ComputeCalibration | None:
        """The calibration's compute constants for this device at the plan's precision (None if none)."""
        dev = self.calibration.devices.get(self.device.name) if self.calibration is not None else None
        return dev.compute.get(plan.precision) if dev is not None else None

    def _dp_unit_s(self, plan: Plan) -> float:
        """Calibrated host time of the data-parallel wrapper per wrapped module and action (0 if none)."""
        comp = self._fitted_compute(plan)
        return comp.dp_unit_overhead_s if comp is not None else 0.0

    def _split_host_s(self, plan: Plan) -> tuple[float, float, float]:
        """Calibrated host time of a split backward per operator I walks, per W pass and per operator
        W's passes walk (:func:`mindpipe.simulator.build.split_backward_walks`; zeros if not fitted)."""
        comp = self._fitted_compute(plan)
        return (0.0, 0.0, 0.0) if comp is None else (comp.split_input_op_s, comp.weight_pass_s, comp.weight_pass_op_s)

    def _swap_s_per_byte(self, plan: Plan) -> float:
        """Calibrated seconds per swapped byte of a CPU copy (0: none fitted, the catalog prices it)."""
        comp = self._fitted_compute(plan)
        return comp.swap_s_per_byte if comp is not None else 0.0

    def _copy_s_per_byte(self, plan: Plan) -> float:
        """Compute time per byte of a copy on the rank's device (each byte read and written once):
        on a CPU the host copy's (:func:`~mindpipe.simulator.costs.cpu_copy_s`, calibrated when
        the calibration fitted runs that swap), on a GPU a memory-bound kernel at the GPU kernel
        model's achieved bandwidth, with or without a profiled trace (the catalog's, for devices without one)."""
        if self.device.kind == "cpu":
            return cpu_copy_s(self.device, 1.0, self._swap_s_per_byte(plan))
        if self._kernels is not None:
            return 2.0 / self._kernels.kernel_params(plan.precision).bandwidth_Bps
        return 2.0 / (self.device.memory_bandwidth_GBps * 1e9)

    def _swap_on_compute(self, plan: Plan, schedule: Schedule, swap_bytes: float) -> tuple[float, float, float] | None:
        """Per swapped block, seconds of its CPU copies inside F, I (and B) and W; None off CPUs.

        F packs the block's saved bytes, the backward unpacks them (I or B), and a split backward's
        W unpacks its GEMMs' inputs again (:func:`mindpipe.simulator.costs.swap_weight_reread_bytes`).
        """
        if self.device.kind != "cpu":
            return None
        reread = swap_weight_reread_bytes(self.model, plan) if schedule.split_backward else 0.0
        return (self.swap_copy_s(plan, swap_bytes), self.swap_copy_s(plan, swap_bytes), self.swap_copy_s(plan, reread))

    def _calibration_notes(self, plan: Plan) -> list[str]:
        notes = list(self.host.notes)
        dev = self.calibration.devices.get(self.device.name) if self.calibration is not None else None
        if dev is not None and plan.precision not in dev.compute:
            notes.append(f"no compute calibration for {self.device.name} at {plan.precision}; uncalibrated compute")
        return notes

    def _result(self, plan: Plan, schedule: Schedule, res: EngineResult, params_by_rank: list[int],
                hourly: Hourly | None, notes: SimulationNotes) -> SimulationResult:
        model, cluster, device = self.model, self.cluster, self.device
        t = res.iteration_time_s
        world = plan.world_size
        gbs, s = plan.global_batch_size, model.seq_len
        flops = model_flops_per_iteration(model, gbs)
        peak = device.peak_flops(plan.precision)
        mem = stage_memory(model, plan, device, schedule, stage_layers(plan, model))
        by_stage = [rm.total_bytes / GIB for rm in mem]
        if hourly is not None:
            series, when = hourly
            intensity = (hourly_intensity(series, when, t), f"hourly series, mean over {stamp(when)} + {t:.6g} s")
        else:
            intensity = annual_intensity(cluster.region)
        energy = energy_report(device, t, list(res.compute_s), plan.grad_replicas * plan.tp, cluster.pue, intensity,
                               notes.rank_busy_power_w)
        extra = self._extra(plan, schedule, res, params_by_rank, flops, mem, energy, notes)
        timeline = list(res.timeline) if res.timeline is not None else None
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

    def _extra(self, plan: Plan, schedule: Schedule, res: EngineResult, params_by_rank: list[int], flops: float,
               mem: list[RankMemory], energy: EnergyReport, notes: SimulationNotes) -> SimulationDetails:
        """``result.extra``: the engine's per-rank figures, the memory and energy parts, and notes."""
        compute = self.compute
        warnings: list[str] = []
        if isinstance(compute, TraceComputeModel) and compute.scaled(plan):
            warnings.append(f"trace taken at micro_batch_size={compute.trace.micro_batch_size}, tp={compute.trace.tp}; "
                            f"times scaled linearly to micro_batch_size={plan.micro_batch_size}, tp={plan.tp}")
        if isinstance(compute, TraceComputeModel) and (blocks := compute.block_note(self.model)) is not None:
            warnings.append(blocks)
        if isinstance(compute, TraceComputeModel):  # what the trace did not measure of this plan (precision, device ...)
            warnings += compute.trace.pricing_notes(self.model, plan, self.cluster.gpu)
        warning = "; ".join(warnings) or None
        return SimulationDetails(
            schedule=schedule.name, num_microbatches=plan.num_microbatches, pipeline_time_s=res.pipeline_time_s,
            exposed_dp_comm_s=max(res.exposed_dp_s) if res.exposed_dp_s else 0.0, rank_end_s=list(res.end_s),
            rank_compute_s=list(res.compute_s), rank_tp_comm_s=list(res.comm_busy_s),
            params_per_device_by_rank=params_by_rank, model_flops_per_iteration=flops,
            bytes_by_link_type=dict(res.bytes_by_link_type), device_energy_j=energy.device_energy_j,
            carbon_intensity_g_per_kwh=energy.intensity_g_per_kwh, carbon_intensity_source=energy.intensity_source,
            compute_model=type(compute).__name__,
            memory_by_stage=[rm.parts() for rm in mem],
            precision_bytes=DTYPE_BYTES[plan.precision], warning=warning, stage_clocks_mhz=notes.stage_clocks_mhz,
            rank_busy_power_w=notes.rank_busy_power_w, stage_clocks_note=notes.stage_clocks_note,
            calibration=notes.calibration,
            host_memory_by_stage_gib=[rm.host_bytes / GIB for rm in mem] if any(rm.host_bytes for rm in mem) else [],
            host_capacity_gib=None if self.device.host_memory_bytes is None else self.device.host_memory_bytes / GIB,
            fits_in_device_memory=all(rm.fits_device for rm in mem))


__all__ = ["COST_FIELDS", "HostModel", "Simulator"]
