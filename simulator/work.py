"""What the engine is given and what it returns: per-stage and per-rank work, options, results.

:func:`mindpipe.simulator.build.build_work` fills :class:`StageWork` and :class:`RankWork` from a
plan; :class:`~mindpipe.simulator.engine.Engine` times them under :class:`EngineOptions` and
returns an :class:`EngineResult` (with :class:`TimelineEvent` spans when asked to record).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

from mindpipe.simulator.topology import Phase
from mindpipe.traces.chrome_trace import TimelineEvent


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
        gather_buckets: Parameter all-gather phases of a sharded stage (ZeRO-3, and ZeRO-1/2 under
            FSDP2: :func:`mindpipe.traces.layout.gathers_before_forward`), one per module (FSDP2 unit: the
            stage's own parameters, then each block's; ``build._gather_units``), for the stage's first
            forward. On dedicated devices only the first is exposed before an action, the others
            are prefetched under its compute (:meth:`~mindpipe.simulator.engine.Engine._gather_ahead`).
        regather_buckets: ZeRO-3 gathers again before each backward (weights freed after the forward,
            :func:`mindpipe.traces.layout.reshards_after_forward`); empty otherwise.
        forward_regather_buckets: Gathers before each forward but the step's first, where the weights
            are freed after each backward (:func:`mindpipe.traces.layout.reduces_every_microbatch`).
        gather_copy_s: Compute time of copying one gather of the stage's weights out of the
            all-gather buffer into the parameters (FSDP2's ``foreach_all_gather_copy_out``, or
            ``replicate``'s copy in ``wait_for_unshard``, on the compute stream after the gather
            lands), added to the step's first forward and each action that gathers again
            (:func:`mindpipe.simulator.build.build_work`); 0 where
            :func:`mindpipe.traces.layout.copies_dp_buffers` says no copy is made (no wrapper, or
            Megatron-LM's in-place buffers).
        reduce_copy_s: Compute time of copying the stage's gradients into the reduction's input
            buffer (FSDP2's ``foreach_reduce_scatter_copy_in``, on the compute stream, casting to the
            reduction's dtype), added to each action after which the gradients are reduced (also with
            one replica, where the wrapper still makes the copy); 0 where no copy is made.
        reduce_every_backward: ``dp_buckets`` are reduce-scattered in every backward, as it produces
            them (:func:`mindpipe.traces.layout.reduces_every_microbatch`), not once per step.
        swap_out, swap_out_tail, swap_in: vPipe swap of activations (host copies): out, the stage's
            swapped blocks but the last, from ``swap_stream_s`` before the forward ends (copied as
            the forward makes them); out, the last swapped block's, after the forward; back, the last
            swapped block's, before the backward, the others during it (``swap_chain_in``;
            :func:`mindpipe.simulator.planning.exposed_swap_s` prices the same).
        swap_stream_s: :func:`swap_stream_window_s` of the stage.
        swap_chain_s: :func:`swap_chain_stall_s` of the stage: added to each prefetched backward
            (B or I; :func:`~mindpipe.simulator.actions.prefetched_backward`), before which
            ``swap_in`` (the last swapped block's) comes back.
        swap_lowest_s: Seconds from a prefetched backward's start to its first swapped block's
            (:func:`swap_chain`): a prefetch under a backward of the same stage starts then.
        swap_chain_in: The other swapped blocks' copies back: on the host link from a prefetched
            backward's start (their wait is ``swap_chain_s``), or, for a backward right after its
            own forward, after ``swap_in`` and before the backward, which asks for them all.
        swap_lazy: The stage copies its swapped blocks back as each backward asks for them
            (``Plan.swap_copy_back`` ``lazy``, :func:`mindpipe.traces.layout.lazy_copy_back`): all of
            ``swap_in`` and ``swap_chain_in`` from the backward's start, which waits for them.
        swap_weight_in: Under a split backward on a GPU, what each W copies back again: the inputs
            of its swapped blocks' weight-gradient GEMMs
            (:func:`mindpipe.simulator.costs.swap_weight_reread_bytes`), unpacked as W asks for them,
            on the compute stream, so W waits for the copy (``executor/offload.py``).
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
    swap_out_tail: list[Phase] = field(default_factory=list)
    swap_in: list[Phase] = field(default_factory=list)
    swap_stream_s: float = 0.0
    swap_chain_s: float = 0.0
    swap_lowest_s: float = 0.0
    swap_chain_in: list[Phase] = field(default_factory=list)
    swap_lazy: bool = False
    swap_weight_in: list[Phase] = field(default_factory=list)
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

    def copy_in_action_s(self, kind: str, mb: int, last_grad: bool, overlap_grad_reduce: bool) -> float:
        """Seconds of the data-parallel wrapper's copies (``gather_copy_s``, ``reduce_copy_s``) inside
        the ``kind`` action of micro-batch ``mb`` (``last_grad``: the stage's last B or W of the step).

        The weights are copied out of their gather in the step's first forward and in every action
        that gathers again; the gradients into the reduction's buffer in every backward that reduces
        from its own hooks (FSDP2 per micro-batch, or ``overlap_grad_reduce``'s last backward). The
        engine and the clock planners' DAG place the copies by this rule; the rest is
        :meth:`copy_after_s`. Memory-bound: no clock stretches them.
        """
        t = 0.0
        if (kind == "F" and (mb == 0 or self.forward_regather_buckets)) or (kind in ("B", "I") and self.regather_buckets):
            t += self.gather_copy_s
        if kind in ("B", "W") and (self.reduce_every_backward or (last_grad and overlap_grad_reduce)):
            t += self.reduce_copy_s
        return t

    def copy_after_s(self, overlap_grad_reduce: bool) -> float:
        """Seconds of the gradients' copy into the reduction's buffer after the rank's last action:
        a stage reduced once per step after its backwards (torch's pipelining runtime runs FSDP2's
        post-backward in ``perform_reduce_grad``, once the last backward has sent its input gradient)."""
        return 0.0 if self.reduce_every_backward or overlap_grad_reduce else self.reduce_copy_s


class _Action(Protocol):  # simulator.actions.Action (imported there from here would be a cycle)
    @property
    def stage(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def microbatch(self) -> int: ...


def last_grad_index(order: Sequence[_Action]) -> dict[int, int]:
    """Per stage of a rank's ``order``, the index of its last B or W action: the step's last
    gradient work, after which (or within which) the stage's gradients are reduced."""
    return {a.stage: i for i, a in enumerate(order) if a.kind in ("B", "W")}


@dataclass(frozen=True)
class StepCopies:
    """Where one step's data-parallel copies fall (:meth:`StageWork.copy_in_action_s`,
    :meth:`StageWork.copy_after_s`), for the clock planners and the power of a clocked rank.

    Attributes:
        in_action: Seconds per (kind, stage, micro-batch) action that holds copies.
        after: Per stage, seconds after its rank's last action and the micro-batch of the stage's
            last gradient action (whose clock the copy keeps under per-action clocks).
    """

    in_action: dict[tuple[str, int, int], float]
    after: list[tuple[float, int]]

    @cached_property
    def stage_total(self) -> list[float]:
        """Per stage, all its copy seconds in one step (summed once, read on every DAG evaluation)."""
        total = [t for t, _ in self.after]
        for (_, s, _), t in self.in_action.items():
            total[s] += t
        return total

    @classmethod
    def of(cls, stages: Sequence[StageWork], orders: Sequence[Sequence[_Action]], overlap_grad_reduce: bool) -> StepCopies:
        in_action: dict[tuple[str, int, int], float] = {}
        after = [(0.0, 0)] * len(stages)
        for order in orders:
            last = last_grad_index(order)
            for i, a in enumerate(order):
                t = stages[a.stage].copy_in_action_s(a.kind, a.microbatch, i == last.get(a.stage), overlap_grad_reduce)
                if t > 0.0:
                    key = (a.kind, a.stage, a.microbatch)
                    in_action[key] = in_action.get(key, 0.0) + t
            for s, i in last.items():
                after[s] = (stages[s].copy_after_s(overlap_grad_reduce), order[i].microbatch)
        return cls(in_action, after)


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
    param_gather: list[list[Phase]] = field(default_factory=list)  # ZeRO-1/2 after the step (Megatron's)
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



def swap_stream_window_s(block_forward_s: Sequence[float], swapped: Sequence[bool]) -> float:
    """Forward seconds of a stage's blocks from its first swapped block on: the window in which the
    copy out of its swapped blocks runs under the forward (0 without a swapped block).

    Measured on an H200 (``benchmarks/results/gpu-h200``, swap-all, pp 1): the forward took 13.8 ms
    with every block's copy streaming beside it against 14.7 ms kept, and the backward waited for
    the rest of the copy out and the copy back (70 ms per micro-batch for 2.2 GB each way).
    """
    first = next((i for i, on in enumerate(swapped) if on), None)
    return 0.0 if first is None else float(sum(block_forward_s[first:]))


def swap_chain_stall_s(backward_s: Sequence[float], copy_s: Sequence[float | None]) -> float:
    """:func:`swap_chain` 's wait."""
    return swap_chain(backward_s, copy_s)[0]


def swap_chain(backward_s: Sequence[float], copy_s: Sequence[float | None]) -> tuple[float, float]:
    """Seconds a backward waits for its swapped blocks' copies back, but the last swapped block's.

    The executor's chain on a prefetched backward (:func:`mindpipe.executor.offload.install_prefetch`):
    the last swapped block's copy is back before the backward starts (prefetched under the action
    before); as each swapped block's backward starts (its first saved tensor asked for), the copy
    of the next swapped block below it starts, one at a time on the host link, and that block's
    backward waits for it. ``backward_s`` and ``copy_s`` are per unit of the stage in
    forward order: its backward seconds (with any re-run forward) and, for a swapped unit, its
    copy's seconds alone on the link (None for the others).

    Returns:
        (the wait, seconds from the backward's start to its first swapped block's: where, in
        1F1B's cool-down, the next backward's prefetch starts).
    """
    swapped = [i for i, c in enumerate(copy_s) if c is not None]
    if not swapped:
        return 0.0, 0.0
    below = swapped_below(swapped)
    t = link = stall = lowest = 0.0
    ready: dict[int, float] = {}
    for i in reversed(range(len(backward_s))):
        if (wait := ready.get(i, t) - t) > 0.0:
            stall += wait
            t += wait
        if i == swapped[0]:
            lowest = t
        if (j := below.get(i)) is not None:  # i's first use starts j's copy
            link = max(t, link) + float(copy_s[j] or 0.0)
            ready[j] = link
        t += backward_s[i]
    return stall, lowest


def swapped_below(swapped: Sequence[int]) -> dict[int, int]:
    """Each swapped unit's next swapped unit below it (``swapped`` ascending): the one whose copy
    back its first use starts (the executor's chain)."""
    return dict(zip(swapped[1:], swapped[:-1], strict=True))


def swap_out_tail_s(copy_s: float, swapped: int) -> float:
    """The part of the copy out that cannot start before the forward ends: the last swapped block's
    share of ``copy_s`` (its last tensors are made at the forward's end). The planners pass seconds,
    the engine's build (``simulator/build.py``) bytes: the same share."""
    return copy_s / swapped if swapped > 0 else 0.0


__all__ = ["EngineOptions", "EngineResult", "RankWork", "StageWork", "StepCopies", "TimelineEvent", "last_grad_index",
           "swap_chain", "swap_chain_stall_s", "swap_out_tail_s", "swap_stream_window_s", "swapped_below"]
