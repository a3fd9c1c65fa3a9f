"""The measured-run contract: what ``mindpipe run`` records about real training.

A measured run is written as a :class:`mindpipe.traces.trace.Trace` whose optional ``measurement`` field
holds a :class:`Measurement`, so one file serves two readers: the simulator reads the per-layer
records like any trace (``TraceComputeModel(Trace.load("measured.json"))``), and calibration
(issue 7) reads the raw timings kept here — per-step loss and iteration time, every compute action
of every rank and micro-batch with its start time, communication waits and collectives, peak
memory, throughput, MFU and energy.

Times are seconds. ``start_s`` values share one origin per run: the moment all ranks left a
barrier just before the first step, each rank measuring from its own copy of that instant (so
cross-rank alignment is as good as the barrier's exit skew, typically well under a millisecond
on one host).

This module is torch-free and imports nothing from :mod:`mindpipe.traces.trace` (which imports it).
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field

from mindpipe.traces.config import Plan, non_negative, one_of, positive
from mindpipe.traces.errors import ContractError
from mindpipe.traces.noise_scale import GradientNoise
from mindpipe.traces.schema import check_format_version

MEASUREMENT_FORMAT_VERSION = 1
ACTION_KINDS = ("F", "B", "I", "W")
# p2p_wait: blocked in a pipeline send/recv wait; dp_sync: data-parallel gradient reduction
# (FSDP2 reduce-scatter or replicate all-reduce) after the last backward; collective: one
# collective observed in a profiled step (TP all-reduce/all-gather/reduce-scatter, FSDP
# all-gather, ...). The optimizer step is compute: an OptimizerRecord, not a CommEvent.
COMM_KINDS = ("p2p_wait", "dp_sync", "collective")
AXES = ("pp", "dp", "tp", "world", "unknown")
BACKENDS = ("gloo", "nccl")
DEVICE_KINDS = ("cpu", "cuda")
MEMORY_SOURCES = ("cuda_allocator", "process_rss")
# Where a rank's peak device memory comes from: CUDA's allocator, or the executor's accounting of
# live tensors (CPU ranks; mindpipe.executor.memory_account says what it counts).
DEVICE_MEMORY_SOURCES = ("cuda_allocator", "tensor_accounting")
ENERGY_SOURCES = ("nvml", "estimated")


@dataclass
class StepRecord:
    """One training step (all ranks).

    Attributes:
        step: 1-based global step number (continues across a resume).
        loss: Mean next-token loss over the whole global batch.
        iteration_s: Wall time of the step, the slowest rank's.
        tokens_per_s: Global batch tokens over ``iteration_s``.
    """

    step: int
    loss: float
    iteration_s: float
    tokens_per_s: float

    def __post_init__(self) -> None:
        if self.step < 1:
            raise ContractError("", "step", f"step={self.step} must be >= 1")
        # A step that took no time is not a measurement (and would divide by zero downstream).
        positive("iteration_s", self.iteration_s)
        non_negative("tokens_per_s", self.tokens_per_s)


@dataclass
class ActionRecord:
    """One compute action of one rank: F, B (full backward), I (input grad) or W (weight grad).

    ``cpu_s`` is the CPU time the action used (CPU ranks): of the rank's thread when it runs one
    intra-op thread (gloo's own threads, copying other messages meanwhile, are left out), else of
    the whole process. It is the action's work, whatever else shared the cores; calibration fits
    compute to it.

    ``memory_bytes`` is the rank's accounted device memory at its peak while the action ran
    (:mod:`mindpipe.executor.memory_account`; from the action's start, before the gradients it made
    are re-read), the figure ``Simulator.memory_by_action`` predicts; None in runs without it.
    """

    rank: int
    step: int
    stage: int
    microbatch: int
    kind: str
    start_s: float
    duration_s: float
    cpu_s: float | None = None
    memory_bytes: int | None = None

    def __post_init__(self) -> None:
        one_of("kind", self.kind, ACTION_KINDS)
        for key in ("rank", "stage", "microbatch"):
            non_negative(key, getattr(self, key))
        non_negative("duration_s", self.duration_s)
        non_negative("cpu_s", self.cpu_s)
        non_negative("memory_bytes", self.memory_bytes)


@dataclass
class OptimizerRecord:
    """One rank's optimizer step in one training step (every optimizer of its stages, together):
    the measured counterpart of the simulator's ``optimizer`` timeline event."""

    rank: int
    step: int
    start_s: float
    duration_s: float

    def __post_init__(self) -> None:
        for key in ("rank", "step", "duration_s"):
            non_negative(key, getattr(self, key))


@dataclass
class CommEvent:
    """Time a rank spent on (or blocked in) communication.

    Attributes:
        rank, step: Who and when.
        kind: ``p2p_wait``, ``dp_sync`` or ``collective`` (see ``COMM_KINDS``).
        axis: Mesh axis of the process group (``pp``, ``dp``, ``tp``; ``world`` or ``unknown``).
        op: ``recv``/``send`` waits, ``reduce_grad``, or the collective's name
            (``allreduce``, ``allgather``, ``reducescatter``, ...).
        start_s, duration_s: Host-side interval.
        size_bytes: Message size when known (collectives of a profiled step).
        group_size: Ranks in the process group when known.
    """

    rank: int
    step: int
    kind: str
    axis: str
    op: str
    start_s: float
    duration_s: float
    size_bytes: int | None = None
    group_size: int | None = None

    def __post_init__(self) -> None:
        one_of("kind", self.kind, COMM_KINDS)
        one_of("axis", self.axis, AXES)
        non_negative("rank", self.rank)
        non_negative("duration_s", self.duration_s)
        non_negative("size_bytes", self.size_bytes)
        non_negative("group_size", self.group_size)


@dataclass
class StageMemory:
    """Peak device memory of one rank's pipeline stages (all the virtual stages it runs).

    Comparable per pipeline rank with the simulator's memory model
    (``Simulator.memory(plan)``: weights, gradients, optimizer state, held activations, the
    transient of a recomputed or swapped-in block).

    Attributes:
        peak_bytes: The device's peak: CUDA's allocator peak, or the accounted peak on a CPU.
        source: ``cuda_allocator`` or ``tensor_accounting`` (see ``DEVICE_MEMORY_SOURCES``).
        accounted_peak_bytes: The peak of the live-tensor accounting (both devices): the sum of
            the five terms below, at the instant it was largest.
        weights_bytes, gradients_bytes, optimizer_bytes, activations_bytes, transient_bytes:
            The accounting's terms at that instant (activations: tensors saved for backward;
            transient: a recomputed block's saved tensors and swapped-in copies).
        host_pool_peak_bytes: Most bytes swapped blocks held in host memory at once (not device).
        budget_bytes: The emulated device capacity (``--memory-budget-gib``), None without one.
    """

    peak_bytes: int
    source: str
    accounted_peak_bytes: int
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    transient_bytes: int
    host_pool_peak_bytes: int = 0
    budget_bytes: int | None = None

    def __post_init__(self) -> None:
        one_of("source", self.source, DEVICE_MEMORY_SOURCES)
        terms = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "transient_bytes")
        for key in ("peak_bytes", "accounted_peak_bytes", "host_pool_peak_bytes", *terms):
            non_negative(key, getattr(self, key))
        if self.budget_bytes is not None:
            positive("budget_bytes", self.budget_bytes)
        total = sum(getattr(self, k) for k in terms)
        if total != self.accounted_peak_bytes:
            raise ContractError("", "accounted_peak_bytes", f"accounted_peak_bytes={self.accounted_peak_bytes} is not "
                                                            f"the sum of its terms ({total})")


@dataclass
class RankRecord:
    """Per-rank totals over the measured steps (warm-up excluded), as means per step.

    Attributes:
        rank: Global rank; ``pp_rank``, ``dp_rank``, ``tp_rank`` (and ``cp_rank`` under context
            parallelism) its mesh coordinates.
        stages: Virtual pipeline stages this rank runs.
        host: Host name.
        compute_s: F/B/I/W time per step.
        p2p_wait_s: Time blocked in pipeline send/recv waits per step.
        dp_sync_s: Data-parallel gradient reduction per step.
        optimizer_s: Optimizer step per step.
        peak_memory_bytes: Peak allocated device memory (CUDA) or peak process RSS (CPU).
        memory_source: ``cuda_allocator`` or ``process_rss``.
        cpu_time_s: Process CPU time (user + system) per step, from the OS, over the measured
            steps less the profiled one (torch.profiler's own work would inflate it).
        energy_j: Device energy per step from NVML counters; None on CPU.
        memory: Peak device memory of the rank's stages (:class:`StageMemory`); None in runs
            recorded before it existed.
    """

    rank: int
    pp_rank: int
    dp_rank: int
    tp_rank: int
    stages: list[int]
    host: str
    compute_s: float
    p2p_wait_s: float
    dp_sync_s: float
    optimizer_s: float
    peak_memory_bytes: int
    memory_source: str
    cpu_time_s: float | None = None
    energy_j: float | None = None
    memory: StageMemory | None = None
    cp_rank: int = 0

    def __post_init__(self) -> None:
        one_of("memory_source", self.memory_source, MEMORY_SOURCES)
        for key in ("rank", "pp_rank", "dp_rank", "tp_rank", "cp_rank", "compute_s", "p2p_wait_s", "dp_sync_s",
                    "optimizer_s", "peak_memory_bytes", "cpu_time_s", "energy_j"):
            non_negative(key, getattr(self, key))


@dataclass
class SubnetRecord:
    """One subnet a supernet run trained: its id in the sampler's stream, its choices and its loss.

    ``loss`` is the float32 mean over the data-parallel replicas of each replica's mean next-token
    loss, written as the float64 holding that float32 value (so it compares bit for bit).
    """

    id: int
    choices: list[int]
    loss: float

    def __post_init__(self) -> None:
        non_negative("id", self.id)


@dataclass
class SubnetStageRecord:
    """One rank of a supernet run: its stage's time and resident memory.

    Attributes:
        rank, stage, dp_rank: Who.
        compute_s: F and B time over the run; ``stall_s``: time blocked in receives;
            ``update_s``: gradient all-reduce and optimizer steps.
        param_bytes: Every candidate and shared part of the stage.
        resident_param_bytes: Peak of the parameters resident on the device (context switching
            keeps only the candidates of the subnets in flight there).
        resident_state_bytes: Peak of resident parameters + gradients + optimizer state.
        context_switch: Whether switching was on.
    """

    rank: int
    stage: int
    dp_rank: int
    compute_s: float
    stall_s: float
    update_s: float
    param_bytes: int
    resident_param_bytes: int
    resident_state_bytes: int
    context_switch: bool

    def __post_init__(self) -> None:
        for key in ("rank", "stage", "dp_rank", "compute_s", "stall_s", "update_s", "param_bytes",
                    "resident_param_bytes", "resident_state_bytes"):
            non_negative(key, getattr(self, key))


@dataclass
class SubnetSegment:
    """One drained segment of a supernet run: its first subnet, the partition it ran with, its stage times.

    ``stage_compute_s``: per pipeline stage, measured F + B seconds per subnet over the segment
    (mean over the dp replicas) — what online repartition (``--repartition``) decides from.
    ``step_s``: the segment's wall seconds per subnet (the slowest rank's, from its first forward
    to its drain) — what a repartition is judged by; None in files written before it was recorded.
    """

    first: int
    partition: list[int]
    stage_compute_s: list[float]
    step_s: float | None = None

    def __post_init__(self) -> None:
        non_negative("first", self.first)
        non_negative("step_s", self.step_s)
        if len(self.stage_compute_s) != len(self.partition):
            raise ContractError("", "stage_compute_s", "one time per pipeline stage of the partition")
        for i, t in enumerate(self.stage_compute_s):
            non_negative(f"stage_compute_s[{i}]", t)


@dataclass
class Measurement:
    """A measured training run (see module docstring).

    Attributes:
        plan: The plan that ran.
        world_size, nodes: Ranks and hosts.
        backend, device_kind, device_name: ``gloo``/``nccl``; ``cpu``/``cuda``; the catalog
            device (``cpu``, ``h100-sxm5-80gb`` ...) or, if unknown, torch's device name.
        threads_per_rank: ``torch.get_num_threads()`` on each rank.
        cpus_per_node: Logical CPUs of a host (``os.cpu_count()``); with ``threads_per_rank`` it
            says how many ranks the cores run at full speed at once (calibration needs it on CPU).
        torch_version: The torch that ran.
        schedule_source: ``torch`` (torch's schedule class) or ``simulator`` (the simulator's
            action table loaded into torch's runtime).
        seed, data: Initialisation/data seed; ``synthetic`` or the text file used.
        warmup_steps: Leading steps excluded from the aggregates (the first step pays for
            metadata exchange and allocator warm-up).
        steps: Every step that ran in this process launch.
        tokens_per_s: Tokens of one iteration over :attr:`iteration_s`.
        model_flops_per_iteration: ``simulator.ops.model_flops_per_iteration`` (no recompute).
        peak_flops_per_s: Catalog peak per device for the plan's precision; 0 where none applies
            (a supernet run; a CPU run on another CPU than the catalog entry was measured on,
            :func:`mindpipe.traces.catalog.describes_this_host`), and then :attr:`mfu` is 0.
        devices_for_mfu: Devices the peak is multiplied by (GPUs; CPU hosts, since CPU ranks on
            one host share its cores and the catalog describes the whole host).
        mfu: model FLOPs per :attr:`iteration_s` over ``peak_flops_per_s × devices_for_mfu``.
        energy_j_per_iteration: Device energy of one iteration, all devices: the mean over every
            measured step (energy adds up, so the profiled step's share is part of it).
        energy_source: ``nvml`` (GPU energy counters) or ``estimated`` (CPU: catalog idle/max
            power and the measured CPU utilisation).
        energy_notes: How the energy figure was obtained.
        layer_times: How the per-layer records of the enclosing trace were derived.
        actions, comms, ranks: Raw records (see the classes); ``ranks`` has one record per rank, or none.
        optimizer: Every rank's optimizer step of every step (:class:`OptimizerRecord`); empty in
            runs recorded before it was kept.
        timeline_file: Chrome-trace timeline written beside this file, if any.
        gradient_noise: The gradient noise scale measured every step
            (:class:`mindpipe.traces.noise_scale.GradientNoise`); None when the plan has one
            replica and one micro-batch (no two batch sizes to compare), or in runs recorded
            before it existed.
        subnets: Supernet runs: every subnet trained, in subnet order (``steps`` then holds one
            record per subnet: step = id + 1, iteration_s = time between successive subnet completions).
        subnet_stages: Supernet runs: per rank, stage compute, stall and resident bytes.
        subnets_per_hour: Supernet runs: subnets trained over the run's wall time.
        subnet_schedule: Supernet runs: the schedule that ran (``csp`` ...).
        subnet_segments: Supernet runs: every drained segment, with the partition it used (online
            repartition may change it between segments).
    """

    plan: Plan
    world_size: int
    nodes: int
    backend: str
    device_kind: str
    device_name: str
    threads_per_rank: int
    torch_version: str
    schedule_source: str
    seed: int
    data: str
    warmup_steps: int
    steps: list[StepRecord] = field(repr=False)
    tokens_per_s: float
    model_flops_per_iteration: float
    peak_flops_per_s: float
    devices_for_mfu: int
    mfu: float
    energy_j_per_iteration: float
    energy_source: str
    energy_notes: str = ""
    layer_times: str = ""
    actions: list[ActionRecord] = field(default_factory=list, repr=False)  # per micro-batch: thousands
    comms: list[CommEvent] = field(default_factory=list, repr=False)
    ranks: list[RankRecord] = field(default_factory=list)
    optimizer: list[OptimizerRecord] = field(default_factory=list, repr=False)
    timeline_file: str | None = None
    cpus_per_node: int | None = None
    gradient_noise: GradientNoise | None = None
    subnets: list[SubnetRecord] | None = None
    subnet_stages: list[SubnetStageRecord] | None = None
    subnets_per_hour: float | None = None
    subnet_schedule: str | None = None
    subnet_segments: list[SubnetSegment] | None = None
    format_version: int = MEASUREMENT_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self.format_version, MEASUREMENT_FORMAT_VERSION, "measurements")
        one_of("backend", self.backend, BACKENDS)
        one_of("device_kind", self.device_kind, DEVICE_KINDS)
        one_of("energy_source", self.energy_source, ENERGY_SOURCES)
        one_of("schedule_source", self.schedule_source, ("torch", "simulator"))
        for key in ("world_size", "nodes", "threads_per_rank", "devices_for_mfu", "cpus_per_node"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ContractError("", key, f"{key}={getattr(self, key)} must be >= 1")
        if self.world_size != self.plan.world_size:
            raise ContractError(
                "", "world_size", f"world_size={self.world_size} differs from the plan's {self.plan.mesh_text}={self.plan.world_size}"
            )
        for key in ("warmup_steps", "tokens_per_s", "model_flops_per_iteration", "peak_flops_per_s", "mfu",
                    "energy_j_per_iteration"):
            non_negative(key, getattr(self, key))
        if not self.steps:
            raise ContractError("", "steps", "steps must not be empty")
        numbers = [s.step for s in self.steps]
        if any(b != a + 1 for a, b in itertools.pairwise(numbers)):
            raise ContractError("", "steps", f"step numbers must be consecutive, got {numbers}")
        for i, a in enumerate(self.actions):
            if a.rank >= self.world_size:
                raise ContractError("", f"actions[{i}].rank", f"actions[{i}].rank={a.rank} >= world_size={self.world_size}")
        for i, c in enumerate(self.comms):
            if c.rank >= self.world_size:
                raise ContractError("", f"comms[{i}].rank", f"comms[{i}].rank={c.rank} >= world_size={self.world_size}")
        for i, o in enumerate(self.optimizer):
            if o.rank >= self.world_size:
                raise ContractError("", f"optimizer[{i}].rank",
                                    f"optimizer[{i}].rank={o.rank} >= world_size={self.world_size}")
        non_negative("subnets_per_hour", self.subnets_per_hour)
        if self.subnets is not None:
            ids = [sub.id for sub in self.subnets]
            if any(b != a + 1 for a, b in itertools.pairwise(ids)):
                raise ContractError("", "subnets", "subnet ids must be consecutive, in subnet order")
        seen = [r.rank for r in self.ranks]
        if len(set(seen)) != len(seen):
            raise ContractError("", "ranks", "ranks lists a rank twice")
        if seen and max(seen) >= self.world_size:
            raise ContractError("", "ranks", f"ranks lists rank {max(seen)}, past world_size={self.world_size}")
        if seen:
            _check_every_rank(seen, self.world_size)

    @property
    def losses(self) -> list[float]:
        """Per-step losses in step order."""
        return [s.loss for s in self.steps]

    @property
    def measured_steps(self) -> list[StepRecord]:
        """The steps after warm-up (all steps if there are no more than ``warmup_steps``)."""
        return measured_steps(self.steps, self.warmup_steps)

    @property
    def profiled_steps(self) -> set[int]:
        """Steps whose collectives were recorded with the profiler (slower than the others)."""
        return profiled_steps(self.comms)

    @property
    def clean_steps(self) -> list[StepRecord]:
        """The measured steps the profiler did not slow (see :func:`clean_steps`)."""
        return clean_steps(self.steps, self.warmup_steps, self.comms)

    @property
    def iteration_s(self) -> float:
        """The run's iteration time (see :func:`typical_iteration_s`)."""
        return typical_iteration_s(self.steps, self.warmup_steps, self.comms)


# Missing ranks named in full up to this many; past it the first few and the count.
_MISSING_SHOWN = 8


def _check_every_rank(seen: list[int], world_size: int) -> None:
    """Refuse a ``ranks`` list that leaves out a rank (the executor writes one record per rank).

    A missing record is a truncated or edited file: calibration would fit the host CPU and the
    optimizer step to the ranks that remain, and read the pipeline of a step from a partial mesh,
    without a word. (An empty list, a run recorded without per-rank totals, stays allowed: readers
    then have no per-rank figures rather than some of them.)

    Raises:
        ContractError: naming the missing rank(s), e.g. ``ranks misses rank 2 of world_size=4``.
    """
    # The ranks listed are distinct and in [0, world_size) (checked before), so this many are
    # missing; the first few are found without walking a huge world_size.
    count = world_size - len(seen)
    if count <= 0:
        return
    listed = set(seen)
    first = list(itertools.islice((r for r in itertools.count() if r not in listed), min(count, _MISSING_SHOWN)))
    shown = ", ".join(str(r) for r in first)
    if count > _MISSING_SHOWN:
        shown += f", … ({count} in all)"
    which = "rank" if count == 1 else "ranks"
    raise ContractError("", "ranks", f"ranks misses {which} {shown} of world_size={world_size} "
                                     "(a measured run has one record per rank)")


def measured_steps(steps: list[StepRecord], warmup_steps: int) -> list[StepRecord]:
    """The steps after warm-up (all steps if there are no more than ``warmup_steps``)."""
    return steps[warmup_steps:] or steps


def profiled_steps(comms: list[CommEvent]) -> set[int]:
    """Steps whose collectives were recorded with the profiler (``collective`` events)."""
    return {c.step for c in comms if c.kind == "collective"}


def clean_steps(steps: list[StepRecord], warmup_steps: int, comms: list[CommEvent]) -> list[StepRecord]:
    """The measured steps less the profiled ones (all measured steps if every one was profiled)."""
    measured = measured_steps(steps, warmup_steps)
    skip = profiled_steps(comms)
    return [s for s in measured if s.step not in skip] or measured


def typical_iteration_s(steps: list[StepRecord], warmup_steps: int, comms: list[CommEvent]) -> float:
    """A run's iteration time: the median over its clean steps.

    The one rule for it (``mindpipe run`` prints it, tokens/s and MFU divide by it, calibration
    fits to it): the profiled step runs the torch profiler around every collective and takes up
    to 3× a plain step on CPU, and one host stall moves a mean but not a median.
    """
    return statistics.median(s.iteration_s for s in clean_steps(steps, warmup_steps, comms))


__all__ = [
    "ACTION_KINDS",
    "AXES",
    "COMM_KINDS",
    "DEVICE_MEMORY_SOURCES",
    "ActionRecord",
    "CommEvent",
    "Measurement",
    "OptimizerRecord",
    "RankRecord",
    "StageMemory",
    "StepRecord",
    "SubnetRecord",
    "SubnetStageRecord",
    "clean_steps",
    "measured_steps",
    "profiled_steps",
    "typical_iteration_s",
]
