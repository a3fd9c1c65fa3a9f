"""Calibrated compute and communication models, and how a calibration file enters a simulation.

Compute: every operator of :mod:`mindpipe.simulator.ops` costs
``scale[kind] × t_ref(op) + op_overhead + fresh_s_per_byte × fresh(op)``,
where ``t_ref`` is the uncalibrated time of that operator — on CPUs its FLOPs over the catalog's
peak (GEMMs) or its bytes over the catalog's bandwidth (memory-bound operators), on GPUs the
shape-aware kernel model of :mod:`mindpipe.simulator.perf`. The scales absorb what the reference misses
(BLAS efficiency at these shapes, cache effects) and the overhead absorbs the host's work per
operator (eager PyTorch dispatch, autograd bookkeeping), which dominates small models on CPUs.

``fresh(op)`` is the size of the operator's result when the CPU allocator takes it fresh from the
kernel (:func:`fresh_bytes`). PyTorch's CPU allocator is glibc's ``malloc``, which serves a request
at or above its mmap threshold with a new ``mmap`` and returns it with ``munmap`` on free; the
executor's CPU ranks pin that threshold at glibc's own ceiling, ``DEFAULT_MMAP_THRESHOLD_MAX``
(4 MiB × sizeof(long) = 32 MiB on 64-bit; mallopt(3), M_MMAP_THRESHOLD), and never trim the heap
below it (:mod:`mindpipe.traces.host_alloc`, the rule's owner). Every result at or above it is
page-faulted and zeroed by the kernel on first touch, each micro-batch again. Measured here
(``benchmarks/fresh_alloc.py``): the LM-head GEMM of gpt-tiny-8k costs the same per sample for
8 and 16 MiB logits and ~50 % more for 32 MiB ones. GPUs use PyTorch's caching allocator: no term.

Communication: the α-β model per link type, with the fitted step latency and achieved bandwidth
(links without a fitted entry keep the uncalibrated model). Where the backend copies with the
host's CPUs (gloo between the ranks of one CPU host), a transfer instead costs its fitted host CPU
time — per algorithm step and per wire byte, :func:`host_terms` — as work on the cores.

CPU ranks of one host share its cores: the executor gives each rank ``cpus // ranks`` threads
(at least one), so ``cpus / threads`` ranks run at full speed at once; the engine shares the
cores among the ranks computing at each moment (:class:`~mindpipe.simulator.engine.EngineOptions`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from mindpipe.simulator.collectives import link_type_capacities, ring_steps, wire_bytes
from mindpipe.simulator.costs import Collective, CommModel, ComputeModel, LayerCost, op_layer_costs
from mindpipe.simulator.ops import Op
from mindpipe.simulator.perf.gpu import GpuComputeModel
from mindpipe.simulator.topology import Phase
from mindpipe.traces.calibration import Calibration, ComputeCalibration, DeviceCalibration, LinkCalibration
from mindpipe.traces.catalog import DeviceSpec
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.traces.host_alloc import CPU_FRESH_ALLOC_BYTES

# Which reference a kind is priced against on CPUs: FLOPs over peak, or bytes over bandwidth.
_FLOP_KINDS = ("gemm", "bmm", "flash")



# Collectives a backend does not implement natively, and what runs instead. gloo has no
# reduce-scatter: torch's ProcessGroupGloo (and so DTensor's Shard redistribution over it) all-reduces
# the whole buffer and keeps its shard — twice the bytes and latency steps of a ring reduce-scatter.
# (Seen in the executor's profiles: sequence-parallel plans on gloo issue all-reduces, no reduce-scatters.)
EMULATED = {"gloo": {"reducescatter": "allreduce"}}


def as_run(op: str, backend: str) -> str:
    """The collective ``backend`` actually runs for ``op``."""
    return EMULATED.get(backend, {}).get(op, op)


def tp_wire_bytes(collectives: Sequence[Collective], tp: int, backend: str = "nccl") -> float:
    """Bytes a rank sends for ``collectives`` over ``tp`` ranks (ring algorithms, as ``backend`` runs them)."""
    return sum(wire_bytes(as_run(c.op, backend), c.nbytes, tp) for c in collectives)


def host_terms(phase: Phase, backend: str) -> tuple[float, float]:
    """(algorithm steps, wire bytes per rank) of ``phase`` as ``backend`` runs it.

    These are what a transfer's host CPU cost is linear in (:class:`CalibratedCommModel`); a
    point-to-point send is one step of its bytes.
    """
    op = as_run(phase.op, backend)
    k = phase.group_size
    return float(phase.count * ring_steps(op, k)), phase.count * wire_bytes(op, phase.msg_bytes, k)


def backend_of(device: DeviceSpec) -> str:
    """The collective backend the executor uses on ``device``: gloo on CPUs, NCCL on GPUs."""
    return "gloo" if device.kind == "cpu" else "nccl"


def threads_per_rank(cpus_per_node: int, ranks_per_node: int) -> int:
    """Threads the executor gives each CPU rank (``executor.launch``: cpus // ranks, at least 1)."""
    return max(1, cpus_per_node // max(1, ranks_per_node))


@dataclass
class ReferenceOpTime:
    """The uncalibrated time of one operator (``t_ref`` in the module docstring)."""

    device: DeviceSpec

    def __post_init__(self) -> None:
        self._gpu = GpuComputeModel(self.device, host_bound=False) if self.device.kind == "gpu" else None

    def fresh_bytes(self, op: Op) -> float:
        """Bytes of ``op``'s result the allocator takes fresh from the kernel (module docstring)."""
        return op.out_bytes if self._gpu is None and op.out_bytes >= CPU_FRESH_ALLOC_BYTES else 0.0

    def __call__(self, op: Op, precision: str) -> float:
        """Seconds of ``op`` at ``precision`` on the device, before calibration."""
        if self._gpu is not None:
            return self._gpu.op_s(op, precision)
        if op.kind in _FLOP_KINDS:
            return op.flops / self.device.peak_flops(precision)
        return op.bytes / (self.device.memory_bandwidth_GBps * 1e9)


@dataclass
class CalibratedComputeModel:
    """Implements :class:`~mindpipe.simulator.costs.ComputeModel` with fitted per-kind scales (module doc).

    Attributes:
        device: The catalog device.
        calibration: Fitted constants per precision.
        fallback: Prices precisions the calibration does not cover.
        thread_ratio: Calibrated threads per rank over the threads a rank gets under the plan;
            the FLOP- and byte-bound part of an operator scales with it (BLAS and element-wise
            kernels spread over threads), the host overhead does not (one Python thread issues it).
        host_op_s: Host CPU per operator spent outside the action on cores the ranks share
            (:attr:`~mindpipe.traces.calibration.DeviceCalibration.op_cpu_s`), charged with the operator.
    """

    device: DeviceSpec
    calibration: dict[str, ComputeCalibration]
    fallback: ComputeModel
    thread_ratio: float = 1.0
    host_op_s: float = 0.0

    def __post_init__(self) -> None:
        self._ref = ReferenceOpTime(self.device)

    def op_s(self, op: Op, cal: ComputeCalibration, precision: str, tp: int = 1) -> float:
        """Calibrated seconds of one operator (of a layer sharded over ``tp`` ranks)."""
        host = 0.0 if op.inner else cal.op_overhead_s + self.host_op_s + (cal.tp_op_overhead_s if tp > 1 else 0.0)
        # Page faults of a fresh result are the kernel's work on the rank's own thread: not scaled by threads.
        fresh = cal.fresh_s_per_byte * self._ref.fresh_bytes(op) if cal.fresh_s_per_byte else 0.0
        return cal.scale.get(op.kind, 1.0) * self._ref(op, precision) * self.thread_ratio + host + fresh

    def phase_times(self, ops: Sequence[Op], cal: ComputeCalibration, precision: str,
                    tp: int = 1) -> tuple[float, float, float, float]:
        """(forward, input-gradient, weight-gradient, attention-core forward) seconds of ``ops``."""
        out = {"forward": 0.0, "backward_input": 0.0, "backward_weight": 0.0}
        core = 0.0
        for op in ops:
            t = self.op_s(op, cal, precision, tp)
            out[op.phase] += t
            if op.attention_core and op.phase == "forward":
                core += t
        return out["forward"], out["backward_input"], out["backward_weight"], core

    def layer_costs(self, model: Model, plan: Plan) -> list[LayerCost]:
        """Per-layer costs (see :class:`~mindpipe.simulator.costs.ComputeModel`)."""
        cal = self.calibration.get(plan.precision)
        if cal is None:
            return self.fallback.layer_costs(model, plan)
        layers = op_layer_costs(model, plan, lambda ops: self.phase_times(ops, cal, plan.precision, plan.tp))
        if cal.tp_comm_cpu_s_per_byte > 0 and plan.tp > 1:
            backend = backend_of(self.device)
            for layer in layers:
                layer.forward_s += cal.tp_comm_cpu_s_per_byte * tp_wire_bytes(layer.forward_comm, plan.tp, backend)
                layer.backward_input_s += cal.tp_comm_cpu_s_per_byte * tp_wire_bytes(layer.backward_comm, plan.tp, backend)
        return layers

    def optimizer_step_s(self, params_per_device: int, plan: Plan) -> float:
        """Fitted fixed time plus time per parameter."""
        cal = self.calibration.get(plan.precision)
        if cal is None:
            return self.fallback.optimizer_step_s(params_per_device, plan)
        return cal.optimizer_overhead_s + cal.optimizer_s_per_param * params_per_device * self.thread_ratio


@dataclass
class CalibratedCommModel:
    """α-β per link type from a calibration; links it does not cover use ``fallback``.

    Attributes:
        links: Fitted constants per link type.
        capacity_Bps: The simulator's bandwidth of each link type, so the achieved bandwidth can
            be expressed as the efficiency the engine asks for.
        fallback: The uncalibrated model.
    """

    links: dict[str, LinkCalibration]
    capacity_Bps: dict[str, float]
    fallback: CommModel
    backend: str = "nccl"

    def latency_s(self, op: str, group_size: int, link: str) -> float:
        """Algorithm steps (of the collective the backend runs) × fitted latency per step."""
        cal = self.links.get(link)
        if cal is None:
            return self.fallback.latency_s(op, group_size, link)
        return ring_steps(as_run(op, self.backend), group_size) * cal.step_latency_s

    def efficiency(self, op: str, nbytes: int, group_size: int, link: str) -> float:
        """Fitted bandwidth over the link's capacity (capped at 1), less for emulated collectives.

        The engine moves the ring bytes of ``op``; when the backend runs a collective that moves
        more (see ``EMULATED``), the achieved rate of ``op``'s bytes drops by that ratio.
        """
        cal = self.links.get(link)
        cap = self.capacity_Bps.get(link, 0.0)
        if cal is None or cap <= 0:
            return self.fallback.efficiency(op, nbytes, group_size, link)
        eff = min(1.0, cal.bandwidth_Bps / cap)
        run = as_run(op, self.backend)
        if run != op and group_size > 1:
            eff *= wire_bytes(op, nbytes, group_size) / wire_bytes(run, nbytes, group_size)
        return eff

    def host_cpu_s(self, phase: Phase) -> float | None:
        """Host CPU time of ``phase`` on a link whose host CPU cost was fitted, else None."""
        cal = self.links.get(phase.link_type)
        if cal is None or (cal.cpu_s_per_step <= 0 and cal.cpu_s_per_byte <= 0):
            return None
        steps, nbytes = host_terms(phase, self.backend)
        return steps * cal.cpu_s_per_step + nbytes * cal.cpu_s_per_byte

    def wait_s(self, phase: Phase) -> float:
        """Wall time the ``phase.count`` blocking collectives of ``phase`` wait for their peers
        (``LinkCalibration.tp_wait_s`` each; 0 on a link without it)."""
        cal = self.links.get(phase.link_type)
        return 0.0 if cal is None else phase.count * cal.tp_wait_s


@dataclass
class Applied:
    """What a calibration changes in one simulation (see :func:`apply_calibration`)."""

    cluster: Cluster
    compute: ComputeModel | None
    comm: CommModel | None
    cores_per_rank_slots: float | None
    step_overhead_s: float
    notes: list[str]
    step_cpu_s: float = 0.0


def apply_calibration(cal: Calibration, device: DeviceSpec, cluster: Cluster, hw_compute: ComputeModel,
                      hw_comm: CommModel) -> Applied:
    """The models and options a calibration implies on ``cluster`` (``hw_*``: the uncalibrated models).

    CPU loopback bandwidth is a property of the host, not of a catalog entry, so a fitted
    ``local`` link also sets the cluster's intra-node bandwidth (the engine's link capacity).
    """
    notes: list[str] = []
    dev: DeviceCalibration | None = cal.devices.get(device.name)
    compute: ComputeModel | None = None
    slots: float | None = None
    overhead = 0.0
    if dev is None:
        notes.append(f"no compute calibration for {device.name}; uncalibrated compute model")
    else:
        ratio = 1.0
        if device.kind == "cpu" and dev.cpus_per_node:
            threads = threads_per_rank(dev.cpus_per_node, cluster.gpus_per_node)
            slots = dev.cpus_per_node / threads
            cal_threads = {c.threads_per_rank for c in dev.compute.values()}
            if len(cal_threads) == 1 and threads not in cal_threads:
                ratio = cal_threads.pop() / threads
                notes.append(f"calibrated at a different thread count; compute scaled by {ratio:.2f}")
        # Host CPU per operator outside the actions competes for the same cores, so it is part of
        # each action's work; on dedicated devices it overlaps with the device and is left out.
        compute = CalibratedComputeModel(device, dev.compute, hw_compute, ratio,
                                         dev.op_cpu_s if slots is not None else 0.0)
        overhead = dev.step_overhead_s
    links = cal.comm.get(backend_of(device), {})
    comm: CommModel | None = None
    if links:
        local = links.get("local")
        if device.kind == "cpu" and local is not None:
            cluster = dataclasses.replace(cluster, intra_node_bandwidth_GBps=local.bandwidth_Bps / 1e9)
        nic = links.get("nic")
        if nic is not None:
            # The fit's β is the node's achieved NIC bandwidth, shared by the flows that cross it
            # (simulator/calibrate/fit.py fit_comm): it becomes the node's link capacity, which the
            # engine divides among concurrent flows, so each gets β / flows as in the fit.
            cluster = dataclasses.replace(cluster, inter_node_bandwidth_Gbps=nic.bandwidth_Bps * 8 / 1e9)
        caps = link_type_capacities(cluster, device)
        comm = CalibratedCommModel(dict(links), caps, hw_comm, backend_of(device))
    else:
        notes.append(f"no {backend_of(device)} calibration; uncalibrated communication model")
    step_cpu = dev.step_cpu_s if dev is not None and slots is not None else 0.0
    return Applied(cluster, compute, comm, slots, overhead, notes, step_cpu)


__all__ = [
    "Applied",
    "CalibratedCommModel",
    "CalibratedComputeModel",
    "ReferenceOpTime",
    "apply_calibration",
    "as_run",
    "backend_of",
    "host_terms",
    "threads_per_rank",
    "tp_wire_bytes",
]
