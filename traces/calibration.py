"""The calibration contract: constants fitted from measured runs (``mindpipe calibrate``).

A calibration file corrects the simulator's hardware models with what the executor measured:

* **compute**, per device and precision: a scale per operator kind (``gemm``, ``bmm``,
  ``flash``, ``memory``) on the uncalibrated model's time of that operator, plus a fixed host
  time per operator (Python dispatch, framework bookkeeping) and the optimizer step's time per
  parameter; on CPUs also how many ranks the host's cores run at full speed at once;
* **communication**, per backend (``gloo``, ``nccl``) and link type (``local``, ``nvlink``,
  ``nic``): a latency per algorithm step and an achieved bandwidth (the α-β model, Hockney 1994);
* **host CPU** (CPU devices, whose ranks share the host's cores): CPU time each rank spends
  outside its compute actions — per operator the actions issue (the schedule's bookkeeping
  around them), per iteration, and per algorithm step and byte of the transfers the backend
  makes with host copies (gloo over loopback) — all of which competes with compute for the cores;
* **step overhead**: host time per iteration outside the schedule and the optimizer;
* **gradient noise scale** (not hardware): the noise scale the runs measured
  (:mod:`mindpipe.traces.noise_scale`), sample-weighted over runs of the one model, which
  ``mindpipe tune --objective goodput`` uses as the critical batch.

Each fitted entry keeps the number of samples it was fitted on and its error on them, and the
file lists the measured runs it came from, so a reader can judge how far to trust it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from mindpipe.traces.config import Model, non_negative, one_of, positive
from mindpipe.traces.errors import ContractError
from mindpipe.traces.reading import CALIBRATION as CALIBRATION_FILE
from mindpipe.traces.schema import check_format_version, from_dict, read_json, write_json

CALIBRATION_FORMAT_VERSION = 1
OP_KINDS = ("gemm", "bmm", "flash", "memory")
BACKENDS = ("gloo", "nccl")
LINK_TYPES = ("local", "nvlink", "nic", "pcie")


def _positive_finite(key: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ContractError("", key, f"{key}={value} must be a positive number")


@dataclass
class ComputeCalibration:
    """Fitted compute constants of one device at one precision.

    Attributes:
        scale: Multiplier per operator kind on the uncalibrated model's operator time (kinds not
            listed keep 1.0). On CPUs the uncalibrated time is FLOPs / catalog peak (GEMMs) and
            bytes / catalog bandwidth (memory-bound operators).
        op_overhead_s: Host time added to every operator.
        tp_op_overhead_s: Extra host time of every operator of a tensor-parallel layer (the
            executor's DTensor dispatch: sharding propagation and redistribution checks in Python).
        tp_comm_cpu_s_per_byte: Host CPU time per byte a rank sends in tensor-parallel collectives
            (gloo copies and reduces on the host; DTensor redistributes), charged as compute — on
            CPUs it competes for the cores like any other work.
        dp_unit_overhead_s: Host time per data-parallel-wrapped module
            (:func:`mindpipe.traces.layout.data_parallel_units`) per forward and backward action:
            the FSDP2/replicate hooks around each module (unshard, reshard, gradient bookkeeping).
        fresh_s_per_byte: Time per byte of an operator result the CPU allocator takes fresh from
            the kernel (page faults and zeroing on first touch;
            :func:`mindpipe.simulator.calibrate.models.ReferenceOpTime.fresh_bytes`). 0 when the
            runs fitted on had no such result.
        swap_s_per_byte: Time per byte of a swapped block's host copy on a CPU rank, charged to the
            action that makes it (:func:`mindpipe.simulator.costs.cpu_copy_s`). 0 when no run
            fitted on swapped: the simulator then prices the copy at the catalog's memory bandwidth.
        split_input_op_s: Host time per operator a split backward's I walks to group the stage's
            parameters (torch's ``stage_backward_input``; :func:`mindpipe.simulator.build.split_backward_walks`).
        weight_pass_s: Host time per autograd pass of a split backward's W (one per parameter group,
            or one merged pass).
        weight_pass_op_s: Host time per operator those passes walk (each from its group down to
            the stage's input). All three 0 when no run fitted on split its backward.
        optimizer_s_per_param: Optimizer step time per parameter a rank holds.
        optimizer_overhead_s: Fixed time of an optimizer step.
        trace_scale: Supernet runs only: the factor by which the actions the executor ran took longer
            than a per-candidate profile (``mindpipe profile SUPERNET``) of the same supernet says, so
            that a simulation given that trace prices candidates as trace × this
            (:mod:`mindpipe.simulator.calibrate.supernet`). 0 when no trace was given to the fit.
        threads_per_rank: Threads each rank ran with when measured (CPU).
        samples: Compute actions the fit used.
        fit_mape: Mean absolute percentage error of the fit on those actions.
    """

    scale: dict[str, float]
    op_overhead_s: float
    tp_op_overhead_s: float = 0.0
    tp_comm_cpu_s_per_byte: float = 0.0
    dp_unit_overhead_s: float = 0.0
    fresh_s_per_byte: float = 0.0
    swap_s_per_byte: float = 0.0
    split_input_op_s: float = 0.0
    weight_pass_s: float = 0.0
    weight_pass_op_s: float = 0.0
    optimizer_s_per_param: float = 0.0
    optimizer_overhead_s: float = 0.0
    trace_scale: float = 0.0
    threads_per_rank: int = 1
    samples: int = 0
    fit_mape: float = 0.0

    def __post_init__(self) -> None:
        for kind, value in self.scale.items():
            one_of("scale", kind, OP_KINDS)
            _positive_finite(f"scale.{kind}", value)
        for key in ("op_overhead_s", "tp_op_overhead_s", "tp_comm_cpu_s_per_byte", "dp_unit_overhead_s", "fresh_s_per_byte", "swap_s_per_byte",
                    "split_input_op_s", "weight_pass_s", "weight_pass_op_s", "optimizer_s_per_param", "optimizer_overhead_s", "trace_scale", "samples", "fit_mape"):
            non_negative(key, getattr(self, key))
        if self.threads_per_rank < 1:
            raise ContractError("", "threads_per_rank", f"threads_per_rank={self.threads_per_rank} must be >= 1")


@dataclass
class DeviceCalibration:
    """Everything fitted for one device (catalog name).

    Attributes:
        kind: ``cpu`` or ``gpu``.
        compute: Per precision (``fp32``, ``bf16``, ``fp16``).
        cpus_per_node: Logical CPUs of a host (CPU devices; ranks share them).
        op_cpu_s: CPU time of a rank per operator of its compute actions spent outside the
            actions (the schedule's Python and autograd bookkeeping around them, which grows with
            the work the action issues), competing for the cores (CPU devices).
        step_cpu_s: CPU time of a rank per iteration outside actions, optimizer and transfers
            (batch, loss, step bookkeeping), competing for the cores (CPU devices).
        host_samples: Rank-iterations the host CPU fit used; ``host_fit_mape`` its error on them.
        step_overhead_s: Wall time per iteration the model still misses once all of the above is
            in (median residual of the fitted runs).
    """

    kind: str
    compute: dict[str, ComputeCalibration]
    cpus_per_node: int | None = None
    op_cpu_s: float = 0.0
    step_cpu_s: float = 0.0
    host_samples: int = 0
    host_fit_mape: float = 0.0
    step_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        one_of("kind", self.kind, ("cpu", "gpu"))
        for precision in self.compute:
            one_of("compute", precision, ("fp32", "bf16", "fp16"))
        if self.cpus_per_node is not None and self.cpus_per_node < 1:
            raise ContractError("", "cpus_per_node", f"cpus_per_node={self.cpus_per_node} must be >= 1")
        for key in ("op_cpu_s", "step_cpu_s", "host_samples", "host_fit_mape", "step_overhead_s"):
            non_negative(key, getattr(self, key))


@dataclass
class LinkCalibration:
    """α-β constants of one link type under one backend.

    Attributes:
        step_latency_s: Latency per algorithm step (a ring all-reduce over k ranks takes 2(k−1)).
        bandwidth_Bps: Achieved bytes per second on the wire (ring traffic 2(k−1)/k·n for an
            all-reduce of n bytes).
        samples: Collectives the fit used; ``fit_mape`` their error.
        cpu_s_per_step, cpu_s_per_byte: Host CPU time per algorithm step and per wire byte of a
            transfer, summed over the ranks' sending and receiving sides, when the backend copies
            with the host's CPUs (gloo over a CPU host's loopback); 0 when not fitted. Such
            transfers cost this CPU time on the cores instead of the α-β wire time.
        tp_wait_s: On a host whose ranks share its cores (a CPU host): the wall time a rank's
            blocking tensor-parallel collective waits for its peers to arrive, per collective, as
            a host with a core per rank shows it. The α-β fit takes each group's fastest events,
            where every peer was already there, and the host fit the CPU time, which a blocked
            rank does not spend; neither holds the skew between the peers. Fitted from the
            profiled collectives' time beyond their group's fastest, divided by the run's
            oversubscription (its ranks over the ranks the cores run at full speed at once): with
            more ranks than cores the waits grow in that proportion, and the shared-core model
            already stretches every rank's work by it. The simulator charges the same wait to the
            other blocking collectives of ranks sharing the cores (FSDP2's gathers and
            reduce-scatters, the step's gradient reduction, the norms' all-reduce). 0 when not fitted.
    """

    step_latency_s: float
    bandwidth_Bps: float
    samples: int = 0
    fit_mape: float = 0.0
    cpu_s_per_step: float = 0.0
    cpu_s_per_byte: float = 0.0
    tp_wait_s: float = 0.0

    def __post_init__(self) -> None:
        non_negative("step_latency_s", self.step_latency_s)
        _positive_finite("bandwidth_Bps", self.bandwidth_Bps)
        for key in ("samples", "fit_mape", "cpu_s_per_step", "cpu_s_per_byte", "tp_wait_s"):
            non_negative(key, getattr(self, key))


@dataclass
class NoiseCalibration:
    """The gradient noise scale measured on a model (McCandlish et al. 2018's B_simple).

    Attributes:
        noise_scale: Samples; the runs' final smoothed estimates weighted by the samples each saw.
        samples: Training samples behind it (all runs).
        model: The model it was measured on; it does not carry over to another model.
        runs: The measured runs it came from.
        data: Their training data (``synthetic`` or the text file), as recorded by the runs.
    """

    noise_scale: float
    samples: int
    model: Model
    runs: list[str] = field(default_factory=list)
    data: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _positive_finite("noise_scale", self.noise_scale)
        positive("samples", self.samples)


@dataclass
class Calibration:
    """A calibration file (see module docstring).

    Attributes:
        devices: Per catalog device name.
        comm: Per backend, per link type.
        measurements: The measured runs it was fitted on (file names and plans).
        created: Left empty by ``mindpipe calibrate`` (the file's content is a function of its runs, so a
            refit of the same runs writes the same bytes); kept for reading older files. ``tool``: what made it.
        gradient_noise: The measured gradient noise scale (None when no run measured one).
    """

    devices: dict[str, DeviceCalibration]
    comm: dict[str, dict[str, LinkCalibration]] = field(default_factory=dict)
    measurements: list[str] = field(default_factory=list)
    created: str = ""
    tool: str = "mindpipe calibrate"
    gradient_noise: NoiseCalibration | None = None
    format_version: int = CALIBRATION_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self.format_version, CALIBRATION_FORMAT_VERSION, "calibration")
        for backend, links in self.comm.items():
            one_of("comm", backend, BACKENDS)
            for link in links:
                one_of(f"comm.{backend}", link, LINK_TYPES)
        if not self.devices and not self.comm and self.gradient_noise is None:
            raise ContractError("", "devices", "a calibration must calibrate at least one device or link "
                                               "(or carry a gradient noise scale)")


def load_calibration(path: str | os.PathLike[str]) -> Calibration:
    """Read a calibration file (errors name the file and the key)."""
    return from_dict(Calibration, read_json(path, CALIBRATION_FILE), str(path))


def save_calibration(cal: Calibration, path: str | os.PathLike[str]) -> None:
    """Write a calibration file (atomically)."""
    write_json(cal, path)


__all__ = [
    "BACKENDS",
    "CALIBRATION_FORMAT_VERSION",
    "LINK_TYPES",
    "OP_KINDS",
    "Calibration",
    "ComputeCalibration",
    "DeviceCalibration",
    "LinkCalibration",
    "NoiseCalibration",
    "load_calibration",
    "save_calibration",
]
