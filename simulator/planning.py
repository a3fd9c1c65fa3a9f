"""What a memory planner asks of the simulator: per-stage memory budgets and the price of a swap.

vPipe (Zhao et al., TPDS'21) and DawnPiper (Peng et al., 2025) choose, together with the partition,
which blocks keep their activations, recompute them or swap them to the host. They try many
(stage, blocks, policies) combinations, so they need the simulator's memory model per stage and the
engine's swap cost without building a plan for each try. Both rules stay with their owners:

* memory: :class:`StageBudget` is :mod:`mindpipe.simulator.memory`'s per-stage arithmetic (the same
  ``StageMemoryModel`` that :func:`~mindpipe.simulator.memory.stage_memory` uses) with the
  schedule's peak in-flight count of the stage read once, so ``total_bytes`` equals
  ``stage_memory``'s rank total for a plan with one stage per rank (a test holds them equal);
  :func:`block_caps` answers the balanced partitioner's question, the most blocks of one policy
  each stage can hold, by bisection on the same arithmetic;
* swap: :func:`exposed_swap_s` is the engine's behaviour (:mod:`mindpipe.simulator.engine`): a
  swapped stage copies its blocks' activations to the host while its forward runs — from the first
  swapped block's start, as the executor packs each saved tensor when it is made
  (:mod:`mindpipe.executor.offload`), the last swapped block's bytes after the forward ends
  (``simulator.work`` ``swap_stream_window_s``, ``swap_out_tail_s``) — and starts copying the last
  swapped block's back when the action before the backward starts, but not before they reached
  the host (``Engine._prefetch``); the backward waits for that copy, and the other swapped blocks
  come back one at a time during it, each started as the swapped block above it begins its
  backward (``simulator.work`` ``swap_chain_stall_s``, the executor's chain). A backward right after
  its own forward gets nothing ahead and asks for its blocks as it goes: all its bytes come back
  before it in the engine. In 1F1B's steady state that action is a
  forward of a later micro-batch, so the copy back hides in it; where the backward directly follows
  its own forward (1F1B's last stage, pp = 1) the bytes make the whole round trip in the open. The
  two directions are separate links (PCIe is full duplex, :mod:`mindpipe.simulator.topology`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from mindpipe.simulator.actions import Held, Schedule
from mindpipe.simulator.memory import RankMemory, StageMemoryModel, activation_bytes_per_layer
from mindpipe.traces.catalog import DeviceSpec
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import BlockPart, BlockPolicy, block_policies, lazy_copy_back


@dataclass(frozen=True)
class StageBudget:
    """Device memory of one pipeline stage (one stage per rank) as a function of its blocks' policies.

    Attributes:
        stage: Virtual stage (= pipeline rank: one stage per rank).
        in_flight: Peak micro-batches the stage holds under the schedule (1F1B: min(p − s, m)).
        round_trip_share: The share of the stage's backwards (B or I) that directly follow their own
            micro-batch's forward on the rank (1F1B: 1 on the last stage, 0 on the others).
        held: The distinct states of the stage over the schedule (micro-batches awaiting I or B,
            awaiting W, gradients present: :meth:`~mindpipe.simulator.actions.Schedule.held_timeline`).
        capacity_bytes: The device's memory.
        has_embedding, has_head: The stage holds the embedding (first) or the head (last).
        prefetch: How many micro-batches' last swapped blocks a prefetch has back on the device
            at once (:meth:`~mindpipe.simulator.actions.Schedule.prefetched_sets`; 0: none is
            prefetched): the memory model counts them there.
    """

    stage: int
    in_flight: int
    round_trip_share: float
    capacity_bytes: float
    has_embedding: bool
    has_head: bool
    held: tuple[Held, ...]
    prefetch: int
    _mm: StageMemoryModel
    _totals: dict[tuple[tuple[tuple[str, str], int], ...], RankMemory] = field(
        default_factory=dict, compare=False, repr=False)

    def block_bytes(self, policy: BlockPolicy, part: BlockPart = "whole") -> float:
        """Bytes one block (or its ``attention`` / ``mlp`` part) keeps per micro-batch under ``policy``
        (0 for ``swap``)."""
        return self._mm.block(policy, part)

    def memory(self, policies: Sequence[BlockPolicy], parts: Sequence[BlockPart] | None = None) -> RankMemory:
        """The rank's peak memory when the stage holds blocks with ``policies``, in order; ``parts``
        says what it holds of each (all ``whole`` by default; a stage boundary inside a block leaves
        its first an ``mlp`` or its last an ``attention`` part, :mod:`mindpipe.traces.layout`)."""
        terms = self._mm.stage(list(policies), self.has_embedding, self.has_head,
                               None if parts is None else list(parts), prefetch=self.prefetch)
        return self._mm.rank(self.stage, {self.stage: terms}, [{self.stage: pair} for pair in self.held])

    def _memo(self, policies: Sequence[BlockPolicy], parts: Sequence[BlockPart] | None) -> RankMemory:
        """:meth:`memory`, memoised: it depends only on how many blocks, or parts of blocks, have
        each policy."""
        pairs = zip(policies, parts or ["whole"] * len(policies), strict=True)
        key = tuple(sorted(Counter(pairs).items()))
        got = self._totals.get(key)
        if got is None:
            got = self._totals[key] = self.memory(policies, parts)
        return got

    def total_bytes(self, policies: Sequence[BlockPolicy], parts: Sequence[BlockPart] | None = None) -> float:
        """Total device bytes of :meth:`memory`."""
        return self._memo(policies, parts).total_bytes

    def host_fits(self, policies: Sequence[BlockPolicy], parts: Sequence[BlockPart] | None = None) -> bool:
        """True when the stage's swapped activations fit in the host memory per device (or it is not known)."""
        return self._memo(policies, parts).fits_host

    def fits(self, policies: Sequence[BlockPolicy], parts: Sequence[BlockPart] | None = None) -> bool:
        """True when the stage fits in the device's memory and its swapped activations in the host's."""
        return self._memo(policies, parts).fits

    def lazy(self) -> StageBudget:
        """The same stage copying its swapped blocks back as its backwards ask (``Plan.swap_copy_back``
        ``lazy``): nothing prefetched."""
        return dataclasses.replace(self, prefetch=0, _totals={})


def stage_budgets(model: Model, plan: Plan, device: DeviceSpec, schedule: Schedule) -> list[StageBudget]:
    """A :class:`StageBudget` per stage of a plan with one stage per pipeline rank.

    Raises:
        ContractError: the plan interleaves several stages on a rank (their memory is coupled).
    """
    if schedule.num_stages != schedule.pp:
        raise ContractError("plan", "virtual_stages", "memory planning needs one stage per pipeline rank "
                            f"(virtual_stages=1), got {schedule.num_stages} stages on {schedule.pp} ranks")
    mm = StageMemoryModel(model, plan, device, None, None, split_backward=schedule.split_backward)
    last, lazy = schedule.num_stages - 1, lazy_copy_back(plan)
    out = []
    for s in range(schedule.num_stages):
        held = tuple(sorted({t.get(s, Held(0, 0, False)) for t in schedule.held_timeline(s, lazy)}))
        out.append(StageBudget(s, max((h.awaiting_input + h.awaiting_weight for h in held), default=0),
                               schedule.round_trip_share(s), float(device.memory_capacity_bytes),
                               s == 0, s == last, held, schedule.prefetched_sets(s, lazy), mm))
    return out


def swap_bytes_per_block(model: Model, plan: Plan) -> float:
    """Bytes one swapped block copies to the host and back per micro-batch: its activations kept whole
    (FlashAttention's under the plan's ``flash_attention``, :mod:`mindpipe.simulator.memory`)."""
    return activation_bytes_per_layer(model, plan, policy="none")


def exposed_swap_s(copy_s: float, forward_s: float, round_trip_share: float = 0.0, stream_s: float = 0.0,
                   tail_s: float = 0.0, back_s: float | None = None, chain_s: float = 0.0, lazy: bool = False) -> float:
    """Seconds per micro-batch a stage's backward waits for its swapped activations (module docstring).

    Args:
        copy_s: Time to copy the stage's swapped bytes of one micro-batch one way, alone on the link.
        forward_s: The stage's forward per micro-batch: the window the copy back hides in.
        round_trip_share: The share of the stage's backwards that directly follow their own forward
            (:attr:`StageBudget.round_trip_share`): each waits for the copy out and the copy back.
        stream_s: :func:`~mindpipe.simulator.work.swap_stream_window_s`: how long the copy out runs before the forward ends.
        tail_s: :func:`~mindpipe.simulator.work.swap_out_tail_s`: the part of the copy out that starts at the forward's end.
        back_s: The copy back before a prefetched backward: the last swapped block's (``copy_s`` if None).
        chain_s: :func:`~mindpipe.simulator.work.swap_chain_stall_s`: a prefetched backward's wait
            for the other swapped blocks' copies back during it.
        lazy: The stage copies back as its backwards ask (``Plan.swap_copy_back``): none is
            prefetched, and each backward waits for all its bytes (``copy_s``).

    Returns:
        round_trip_share · (max(tail_s, copy_s − stream_s) + copy_s)
        + (1 − round_trip_share) · (max(0, back_s − forward_s) + chain_s): a backward right after
        its own forward waits for all its bytes out and back; a prefetched one for what its last
        swapped block's copy does not hide, and the chain; on a ``lazy`` stage, ``copy_s`` instead.
    """
    back = copy_s if back_s is None else back_s
    out = max(tail_s, copy_s - stream_s)
    ahead = copy_s if lazy else max(0.0, back - forward_s) + chain_s
    return round_trip_share * (out + copy_s) + (1.0 - round_trip_share) * ahead


def block_caps(model: Model, plan: Plan, device: DeviceSpec, schedule: Schedule, *,
               reserved_bytes: float | None = None) -> list[int] | None:
    """Most blocks each stage can hold in device memory, for a partitioner; None when not separable.

    With one stage per rank and one policy for every block, a rank's total in :func:`stage_memory`
    grows with its block count n (model states and held activations by one block's worth per
    block at every point of the schedule; the peak is the largest of those affine totals, so convex
    in n: a warm-up without gradients can give way to a steady state with them), and the cap is the
    largest n whose total fits, found by bisection on the same arithmetic. Several chunks per rank
    couple their stages, and per-block policies (or a boundary inside a block) depend on where the
    cut falls: None there (the memory check after partitioning still decides).
    """
    if plan.virtual_stages != 1 or plan.layer_memory_policy is not None or plan.cuts_inside_blocks:
        return None
    mm = StageMemoryModel(model, plan, device, reserved_bytes, None, split_backward=schedule.split_backward)
    policy = block_policies(plan, 1)[0]
    cap = float(device.memory_capacity_bytes)
    last = schedule.num_stages - 1
    out = []
    lazy = lazy_copy_back(plan)
    for s in range(schedule.num_stages):
        timeline = schedule.held_states(schedule.stage_to_rank[s], lazy)
        prefetch = schedule.prefetched_sets(s, lazy)

        def fits(n: int, s: int = s, timeline: list[dict[int, Held]] = timeline, prefetch: int = prefetch) -> bool:
            return mm.rank(0, {s: mm.stage([policy] * n, s == 0, s == last, prefetch=prefetch)}, timeline).total_bytes <= cap

        lo, hi = 0, model.num_layers  # fits(lo) holds (or lo is 0); find the largest such n
        if fits(hi):
            out.append(hi)
            continue
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        out.append(lo)
    return out


__all__ = ["StageBudget", "block_caps", "exposed_swap_s", "stage_budgets", "swap_bytes_per_block"]
