"""What the engine is given and what it returns: per-stage and per-rank work, options, results.

:func:`mindpipe.simulator.build.build_work` fills :class:`StageWork` and :class:`RankWork` from a
plan; :class:`~mindpipe.simulator.engine.Engine` times them under :class:`EngineOptions` and
returns an :class:`EngineResult` (with :class:`TimelineEvent` spans when asked to record).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mindpipe.simulator.topology import Phase


@dataclass
class StageWork:
    """Per micro-batch work of one virtual stage on its rank.

    Attributes:
        forward_s, input_s, weight_s: Compute of F, I (input gradient) and W (weight gradient).
        recompute_s: Forward compute re-run before I (recompute policy).
        weight_rerun_s: Compute a split backward's W runs beyond the weight gradients (re-runs of
            recomputed blocks, and the input-gradient path a merged pass walks again:
            :func:`mindpipe.simulator.build.weight_pass_extra`); 0 on the first stage and without a
            split backward.
        rerun_tp: TP collectives that extra work issues.
        fwd_tp: TP collective phases of a forward.
        bwd_tp: TP collective phases of the input-gradient pass (with recomputed forward ones).
        send_fwd: Phases moving the output to the next stage (None: same rank or last stage).
        send_bwd: Phases moving the input gradient to the previous stage.
        dp_buckets: Gradient-reduction phases per bucket, in issue order.
        gather_buckets: ZeRO-3 parameter all-gather phases, one per sharded module (FSDP2 unit: the
            stage's own parameters, then each block's; ``build._gather_units``), for the stage's first
            forward. On dedicated devices only the first is exposed before an action, the others
            are prefetched under its compute (:meth:`~mindpipe.simulator.engine.Engine._gather_ahead`).
        regather_buckets: ZeRO-3 gathers again before each backward (weights freed after the forward,
            :func:`mindpipe.traces.layout.reshards_after_forward`); empty otherwise.
        forward_regather_buckets: Gathers before each forward but the step's first, where the weights
            are freed after each backward (:func:`mindpipe.traces.layout.reduces_every_microbatch`).
        gather_copy_s: Compute time of copying one gather of the stage's modules out of the
            all-gather buffer into the parameters (FSDP2's ``foreach_all_gather_copy_out``, on the
            compute stream after the gather lands), added to each action that gathers
            (:func:`mindpipe.simulator.build.build_work`); 0 without gathers.
        reduce_copy_s: Compute time of copying the stage's gradients into the reduce-scatter's input
            buffer (FSDP2's ``foreach_reduce_scatter_copy_in``, on the compute stream, casting to the
            reduction's dtype) before each reduction of ``dp_buckets``; 0 where the stage's weights
            are not gathered during the step (DDP and Megatron reduce their buffers in place).
        reduce_every_backward: ``dp_buckets`` are reduce-scattered in every backward, as it produces
            them (:func:`mindpipe.traces.layout.reduces_every_microbatch`), not once per step.
        swap_out, swap_in: vPipe swap of activations after F / before I (host copies).
        fwd_tp_overlap, bwd_tp_overlap: Under ``tp_comm_overlap``, the collectives of ``fwd_tp`` /
            ``bwd_tp`` that pipeline with a GEMM (:class:`TpOverlap`); the engine takes back the part
            the GEMMs hide (:func:`mindpipe.simulator.collectives.overlapped_exposed_s`).
        mb_stretch: Per micro-batch (forward, backward) factors on the compute above, from
            per-action SM clocks (``action_clocks_mhz``, :mod:`mindpipe.simulator.frequency`);
            None: every micro-batch takes the stage's times.
    """

    forward_s: float
    input_s: float
    weight_s: float
    recompute_s: float = 0.0
    weight_rerun_s: float = 0.0
    rerun_tp: list[Phase] = field(default_factory=list)
    fwd_tp: list[Phase] = field(default_factory=list)
    bwd_tp: list[Phase] = field(default_factory=list)
    send_fwd: list[Phase] | None = None
    send_bwd: list[Phase] | None = None
    dp_buckets: list[list[Phase]] = field(default_factory=list)
    gather_buckets: list[list[Phase]] = field(default_factory=list)
    regather_buckets: list[list[Phase]] = field(default_factory=list)
    forward_regather_buckets: list[list[Phase]] = field(default_factory=list)
    reduce_every_backward: bool = False
    gather_copy_s: float = 0.0
    reduce_copy_s: float = 0.0
    swap_out: list[Phase] = field(default_factory=list)
    swap_in: list[Phase] = field(default_factory=list)
    fwd_tp_overlap: list[TpOverlap] = field(default_factory=list)
    bwd_tp_overlap: list[TpOverlap] = field(default_factory=list)
    mb_stretch: list[tuple[float, float]] | None = None

    @property
    def weight_action_s(self) -> float:
        """Compute of one W action: the weight gradients and W's extra work."""
        return self.weight_s + self.weight_rerun_s

    @property
    def backward_compute_s(self) -> float:
        """All backward compute of one micro-batch: re-run, input and weight gradients, W's extra work."""
        return self.recompute_s + self.input_s + self.weight_s + self.weight_rerun_s


@dataclass(frozen=True)
class TpOverlap:
    """``count`` equal TP collectives (``phases`` is one of them), each pipelined in ``chunks`` chunks
    with a GEMM of ``gemm_s`` seconds."""

    phases: list[Phase]
    gemm_s: float
    chunks: int
    count: int = 1


@dataclass
class RankWork:
    """Per-iteration work of a pipeline rank outside the schedule."""

    optimizer_s: float = 0.0
    param_gather: list[list[Phase]] = field(default_factory=list)  # ZeRO-1/2 after the step
    # A tied head's table gradients (mindpipe.traces.layout.tied_table_ranks): after the gradient
    # reductions and before the step, this rank and ``tied_peer`` each send their piece to the other.
    tied_exchange: list[Phase] = field(default_factory=list)
    tied_peer: int | None = None
    # Sequence parallelism's partial norm gradients (costs.partial_grad_params): an all-reduce per
    # stage over the TP group after the data-parallel reductions, before the tied exchange and the step.
    partial_grad_reduce: list[Phase] = field(default_factory=list)


@dataclass
class EngineOptions:
    """Engine knobs.

    Attributes:
        overlap_grad_reduce: Issue gradient buckets during the last backward (else after it).
        overlap_param_gather: The ZeRO-1/2 parameter all-gather after the step runs under the next
            iteration's forward: only its first bucket, and what does not fit under one micro-batch's
            forward of the rank, stay exposed (:meth:`~mindpipe.simulator.engine.Engine._after`).
        pp_first: Pipeline p2p traffic has priority over other traffic on shared links.
        cores_per_rank_slots: For CPU ranks sharing cores: how many ranks a node's cores run at
            full speed at once (cores / threads per rank); None means dedicated devices.
        step_overhead_s: Wall time per iteration outside the actions and the optimizer (the
            schedule's and autograd's bookkeeping, data, loss reduction); calibration fits it,
            hardware models leave it 0. It is spent where it occurs: a rank's share is split
            evenly into a slice before each of its actions and one after its optimizer step.
        comm_on_cores: Transfers are copies made by the host's CPUs (gloo between ranks of one
            host, over loopback): each costs its host CPU time (or, unfitted, its uncontended
            time) as work on the issuing rank's cores, shared with compute, instead of flowing
            over a link. Needs ``cores_per_rank_slots``.
        step_host_s: Host CPU time per iteration on the shared cores outside the actions, split
            like ``step_overhead_s`` (a slice before each action, one after the optimizer).
        record: Keep a timeline of every compute action and transfer.
        blocking_p2p: A rank waits for each pipeline send to land before its next action
            (Megatron-LM; ``Plan.blocking_p2p``); else sends stay in flight while it goes on.
    """

    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = False
    pp_first: bool = False
    cores_per_rank_slots: float | None = None
    step_overhead_s: float = 0.0
    comm_on_cores: bool = False
    step_host_s: float = 0.0
    record: bool = False
    blocking_p2p: bool = False


@dataclass
class TimelineEvent:
    """One span of the timeline: rank, thread (``compute``/``comm``), label, start, end."""

    rank: int
    thread: str
    name: str
    start: float
    end: float
    category: str


@dataclass
class EngineResult:
    """Times of one simulated iteration."""

    iteration_time_s: float
    pipeline_time_s: float
    busy_s: list[float]
    compute_s: list[float]
    end_s: list[float]
    exposed_dp_s: list[float]
    comm_busy_s: list[float]
    bytes_by_link_type: dict[str, float]
    timeline: list[TimelineEvent] | None = None

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the pipeline span, averaged over ranks (the schedule's bubble)."""
        if self.pipeline_time_s <= 0:
            return 0.0
        frac = 1.0 - sum(self.busy_s) / (len(self.busy_s) * self.pipeline_time_s)
        return min(max(frac, 0.0), 1.0)


__all__ = ["EngineOptions", "EngineResult", "RankWork", "StageWork", "TimelineEvent"]
