"""The memory-aware partitioners ``vpipe`` and ``dawnpiper``: a partition and a per-block policy.

Both minimise the slowest stage's time per micro-batch under every device's memory, pricing each
candidate stage with :class:`~mindpipe.tuner.memplan.StageModel` (the simulator's memory and swap
cost, a per-stage keep/recompute/swap rule). They need one stage per pipeline rank.

* ``vpipe`` (Zhao et al., TPDS'21; BACKGROUND.md §4.2): start from PipeDream's dynamic program
  (:func:`~mindpipe.tuner.partition.pipedream_partition`, memory-blind), plan each stage's memory
  greedily (rule ``vpipe``), then Kernighan-Lin-style moves of a boundary block to the neighbouring
  stage while a move lowers (slowest stage time, Σ stage time²). A stage that does not fit even
  with every block recomputed costs ``inf``, so a move is taken only when it lowers the maximum —
  vPipe's search objective is time; memory enters through the per-stage policy.
* ``dawnpiper`` (Peng et al., 2025; BACKGROUND.md §4.3): binary partitioning over stage groups
  on a fine-grained graph: the positions are half blocks (each block's attention and MLP parts,
  :func:`~mindpipe.tuner.memplan.part_nodes`), so a boundary may fall after a block's attention
  (``Plan.stage_cuts``). To split positions lo..hi over stages a..b into a left half of ⌊(b−a)/2⌋ stages and the rest, find
  the compute-balanced cut p_T (per-stage time of the halves as equal as possible) and the
  memory-balanced cut p_M (every node kept: each half's memory as equal a share of its
  capacity as possible); try every cut between them, each half priced by the best plan of its own
  (recursively, memoised), with the Capuchin-style memory plan per stage (rule ``dawnpiper``);
  take the best. DawnPiper's "performance-optimal partition" theorem is what limits the cuts to
  [min(p_T, p_M), max(p_T, p_M)]; when no cut there fits, the rest of the range is tried too.
  A cut inside a block gives the block one policy for both parts, as the plan has one per block and
  the simulator and executor apply it to both: each of keep, recompute (each part re-runs its own
  forward) and swap (when the host link is priced) is tried, both sides priced with it. Selective
  and ``nongemm`` recompute, which the executor refuses on a cut block, are never chosen for one;
  whole blocks may get them (rule ``dawnpiper``, :mod:`mindpipe.tuner.memplan`). A stage that fits
  only by copying its swapped blocks back as the backwards ask is written ``lazy`` in the plan's
  ``swap_copy_back`` (the stages' room and the feasibility check count that floor too).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mindpipe.simulator.build import GRAD_BYTES
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.config import Plan, check_stage_count
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import nongemm_refusal
from mindpipe.tuner.memplan import (
    NO_PINS,
    LayerPolicy,
    MemoryRule,
    Pins,
    StageModel,
    StagePlan,
    block_nodes,
    part_nodes,
)
from mindpipe.tuner.partition import pipedream_partition

MEMORY_PARTITIONERS: tuple[MemoryRule, ...] = ("vpipe", "dawnpiper")


@dataclass(frozen=True)
class MemoryPlan:
    """A partition with its per-block policy (``Plan.layer_memory_policy``), per-stage times and
    where each boundary falls (``Plan.stage_cuts``; None when every one falls between blocks), and
    how each stage's swapped blocks come back (``Plan.swap_copy_back``; None when every stage prefetches)."""

    partition: list[int]
    policy: list[LayerPolicy]
    stage_time_s: list[float]
    stage_cuts: list[str] | None = None
    swap_copy_back: list[str] | None = None

    @property
    def fits(self) -> bool:
        """True when every stage fits (its time is finite)."""
        return all(math.isfinite(t) for t in self.stage_time_s)


def stage_model(sim: Simulator, plan: Plan, halves: bool = False) -> StageModel:
    """The :class:`StageModel` of ``plan`` under ``sim`` (costs, budgets, swap price); ``halves``
    makes its positions half blocks (when every block's cost has its parts)."""
    costs = sim.layer_costs(plan)
    head = [c for c in costs if c.kind == "embedding"]
    tail = [c for c in costs if c.kind in ("final_norm", "lm_head")]

    def fwd_total(layers: Sequence) -> tuple[float, float]:
        return (sum(c.forward_s for c in layers),
                sum(c.forward_s + c.backward_input_s + c.backward_weight_s for c in layers))

    budgets = sim.stage_budgets(plan)
    last = len(budgets) - 1
    extra = {0: fwd_total(head)}
    e_f, e_t = extra.get(last, (0.0, 0.0))
    t_f, t_t = fwd_total(tail)
    extra[last] = (e_f + t_f, e_t + t_t)
    # A device without a host link (a CPU: its memory is the host's) has nowhere to swap to.
    swap = sim.swap_bytes_per_block(plan) if sim.device.pcie_bandwidth_GBps > 0 else 0.0
    return StageModel(block_nodes(costs), budgets, extra, lambda n: sim.swap_copy_s(plan, n), swap,
                      part_nodes(costs) if halves else None, nongemm=nongemm_refusal(plan) is None,
                      reread_bytes=sim.swap_reread_bytes_per_block(plan) if swap > 0 else 0.0)


def _bounds(partition: Sequence[int]) -> list[tuple[int, int]]:
    out, lo = [], 0
    for n in partition:
        out.append((lo, lo + n))
        lo += n
    return out


def _copy_back(plans: Sequence[StagePlan]) -> list[str] | None:
    """``Plan.swap_copy_back`` of the stage plans: None when none is lazy."""
    return ["lazy" if sp.lazy else "prefetch" for sp in plans] if any(sp.lazy for sp in plans) else None


def _assemble(sm: StageModel, partition: list[int], rule: MemoryRule) -> MemoryPlan:
    plans = [sm.plan(s, lo, hi, rule) for s, (lo, hi) in enumerate(_bounds(partition))]
    return MemoryPlan(partition, [p for sp in plans for p in sp.policies], [sp.time_s for sp in plans],
                      swap_copy_back=_copy_back(plans))


def _score(times: Sequence[float]) -> tuple[float, float]:
    top = max(times)
    return top, (sum(t * t for t in times) if math.isfinite(top) else math.inf)


def vpipe_partition(sm: StageModel, start: list[int], max_moves: int = 10_000) -> MemoryPlan:
    """vPipe: per-stage greedy memory plans on ``start``, then boundary moves (module docstring)."""
    part = list(start)
    times = [sm.plan(s, lo, hi, "vpipe").time_s for s, (lo, hi) in enumerate(_bounds(part))]
    best = _score(times)
    for _ in range(max_moves):
        move: tuple[list[int], list[float], tuple[float, float]] | None = None
        for b in range(len(part) - 1):
            for delta in (-1, 1):  # one block from stage b to b+1, or from b+1 to b
                cand = list(part)
                cand[b] += delta
                cand[b + 1] -= delta
                if cand[b] < 1 or cand[b + 1] < 1:
                    continue
                lo = sum(cand[:b])
                t = list(times)
                t[b] = sm.plan(b, lo, lo + cand[b], "vpipe").time_s
                t[b + 1] = sm.plan(b + 1, lo + cand[b], lo + cand[b] + cand[b + 1], "vpipe").time_s
                sc = _score(t)
                if sc < (move[2] if move else best):
                    move = (cand, t, sc)
        if move is None:
            break
        part, times, best = move
    return _assemble(sm, part, "vpipe")


# What the binary search returns for positions lo..hi on stages a..b-1: (slowest stage time, the
# stages' position ranges, the policy of each cut block between them).
_Solution = tuple[float, list[tuple[int, int]], list["LayerPolicy | None"]]
_NONE: _Solution = (math.inf, [], [])


class _DawnPiper:
    """The binary partition search (module docstring), memoised on (lo, hi, first stage, end stage,
    the pinned policies of the blocks cut at lo and hi)."""

    def __init__(self, sm: StageModel) -> None:
        self.sm = sm
        self.prefix = [0.0]
        for i in range(sm.num_positions):
            self.prefix.append(self.prefix[-1] + sm.position_time(i))
        self.memo: dict[tuple[int, int, int, int, Pins], _Solution] = {}
        self.keep: dict[tuple[int, int], float] = {}  # (stage, positions) → kept share of capacity
        swap: tuple[LayerPolicy, ...] = ("swap",) if sm.swap_bytes > 0 else ()
        self.pin_options: tuple[LayerPolicy, ...] = ("keep", "recompute", *swap)
        # Most positions each stage can hold at all (every unit at its least-memory policy, from
        # either alignment): a range that exceeds its stages' sum cannot fit, so it is not searched.
        self.room = [self._room(s) for s in range(sm.num_stages)]

    def _room(self, stage: int) -> int:
        best = 0
        for start in (0, 1) if self.sm.halves else (0,):
            n = 0
            while start + n < self.sm.num_positions:
                units = self.sm.units(start, start + n + 1)
                if not self.sm.fits_at_all(stage, [u[1] for u in units], lazy_ok=True):
                    break
                n += 1
            best = max(best, n)
        return best

    def feasible(self) -> bool:
        """True when some split fits every stage with every unit at its least-memory policy: without
        one no plan fits, and the search (exhaustive when nothing fits) is not run. Each stage in turn
        takes all it can (a stage that fits still fits with fewer units), leaving each later stage a
        block to start."""
        lo, end, p = 0, self.sm.num_positions, self.sm.num_stages
        for s in range(p):
            hi = lo
            while hi < end and self.sm.blocks_started(hi + 1, end) >= p - s - 1:
                units = self.sm.units(lo, hi + 1)
                if not self.sm.fits_at_all(s, [u[1] for u in units], lazy_ok=True):
                    break
                hi += 1
            if self.sm.blocks_started(lo, hi) < 1:
                return False
            lo = hi
        return lo == end

    def _time(self, lo: int, hi: int, a: int, b: int) -> float:
        """Every-unit-kept time of positions lo..hi on stages a..b-1, the embedding and head included."""
        extra = sum(self.sm.extra.get(s, (0.0, 0.0))[1] for s in range(a, b))
        return self.prefix[hi] - self.prefix[lo] + extra

    def _group_memory(self, lo: int, hi: int, a: int, b: int) -> float:
        """Share of capacity positions lo..hi use when kept, spread evenly over stages a..b-1."""
        n, g = hi - lo, b - a
        used = 0.0
        for i, s in enumerate(range(a, b)):
            k = n // g + (1 if i < n % g else 0)
            if (s, k) not in self.keep:
                self.keep[s, k] = self.sm.keep_bytes(s, 0, k) / self.sm.budgets[s].capacity_bytes
            used += self.keep[s, k]
        return used / g

    def cut_points(self, lo: int, hi: int, a: int, b: int) -> tuple[int, int]:
        """(p_T, p_M): the compute-balanced and the memory-balanced cut of positions lo..hi over a..b."""
        mid = a + (b - a) // 2
        g1, g2 = mid - a, b - mid
        cuts = range(lo + g1, hi - g2 + 1)
        p_t = min(cuts, key=lambda c: (max(self._time(lo, c, a, mid) / g1, self._time(c, hi, mid, b) / g2), c))
        p_m = min(cuts, key=lambda c: (max(self._group_memory(lo, c, a, mid), self._group_memory(c, hi, mid, b)), c))
        return p_t, p_m

    def solve(self, lo: int, hi: int, a: int, b: int, pins: Pins = NO_PINS) -> _Solution:
        """The best split of positions lo..hi over stages a..b-1 (``_Solution``)."""
        key = (lo, hi, a, b, pins)
        if key in self.memo:
            return self.memo[key]
        if hi - lo > sum(self.room[a:b]):
            out = _NONE
        elif b - a == 1:
            # A stage starts at least one block (``Plan.partition`` counts ≥ 1 per stage).
            sp = self.sm.plan(a, lo, hi, "dawnpiper", pins)
            out = (sp.time_s, [(lo, hi)], []) if self.sm.blocks_started(lo, hi) >= 1 else _NONE
        else:
            mid = a + (b - a) // 2
            p_t, p_m = self.cut_points(lo, hi, a, b)
            window = range(min(p_t, p_m), max(p_t, p_m) + 1)
            out = self._best(lo, hi, a, mid, b, pins, window)
            if not math.isfinite(out[0]):
                out = self._best(lo, hi, a, mid, b, pins, range(lo + mid - a, hi - (b - mid) + 1))
        self.memo[key] = out
        return out

    def _best(self, lo: int, hi: int, a: int, mid: int, b: int, pins: Pins, cuts: range) -> _Solution:
        best = _NONE
        left_room, right_room = sum(self.room[a:mid]), sum(self.room[mid:b])
        for c in cuts:
            if c - lo > left_room or hi - c > right_room:
                continue
            inside = self.sm.halves and c % 2 == 1  # the cut falls after block c // 2's attention
            for q in self.pin_options if inside else (None,):
                left = self.solve(lo, c, a, mid, (pins[0], q))
                if not left[1] or (best[1] and left[0] >= best[0]):
                    continue  # no better than the best so far, whatever the right half does
                right = self.solve(c, hi, mid, b, (q, pins[1]))
                if not right[1]:
                    continue
                t = max(left[0], right[0])
                if not best[1] or t < best[0]:
                    best = (t, left[1] + right[1], [*left[2], q, *right[2]])
        return best


def _assemble_cuts(sm: StageModel, bounds: list[tuple[int, int]], pins: list[LayerPolicy | None]) -> MemoryPlan:
    """The plan of a solution over (possibly half-block) positions: partition, cuts and block policies."""
    policy: list[LayerPolicy] = ["keep"] * len(sm.nodes)
    plans = []
    for s, (lo, hi) in enumerate(bounds):
        sp = sm.plan(s, lo, hi, "dawnpiper", (pins[s - 1] if s > 0 else None, pins[s] if s < len(pins) else None))
        plans.append(sp)
        for (_, _, block), p in zip(sm.units(lo, hi), sp.policies, strict=True):
            policy[block] = p  # a cut block's two parts carry the same pinned policy
    cuts = ["after_attention" if sm.halves and hi % 2 else "between_blocks" for _, hi in bounds[:-1]]
    return MemoryPlan([sm.blocks_started(lo, hi) for lo, hi in bounds], policy, [sp.time_s for sp in plans],
                      cuts if "after_attention" in cuts else None, _copy_back(plans))


def dawnpiper_partition(sm: StageModel) -> MemoryPlan:
    """DawnPiper's binary, memory-aware partition (module docstring), at ``sm``'s granularity."""
    search = _DawnPiper(sm)
    _, bounds, pins = search.solve(0, sm.num_positions, 0, sm.num_stages) if search.feasible() else _NONE
    if not bounds:  # nothing fits anywhere: report the compute-balanced split, its stages marked unfit
        n, p = len(sm.nodes), sm.num_stages
        part = [n // p + (1 if s < n % p else 0) for s in range(p)]
        return _assemble(sm if not sm.halves else _blocks_of(sm), part, "dawnpiper")
    return _assemble_cuts(sm, bounds, pins)


def _blocks_of(sm: StageModel) -> StageModel:
    """The same stage model over whole blocks."""
    return StageModel(sm.nodes, sm.budgets, sm.extra, sm.copy_s, sm.swap_bytes, nongemm=sm.nongemm,
                      reread_bytes=sm.reread_bytes)


def memory_partition(name: str, sim: Simulator, plan: Plan) -> MemoryPlan:
    """The named memory-aware partition of ``plan`` (one stage per pipeline rank).

    Raises:
        ContractError: an unknown name, interleaved stages, or more stages than blocks.
    """
    if name not in MEMORY_PARTITIONERS:
        raise ContractError("partition", "partitioner", f"{name!r} is not one of {', '.join(MEMORY_PARTITIONERS)}")
    check_stage_count(plan.num_stages, sim.model.num_layers)
    if name == "dawnpiper":
        return dawnpiper_partition(stage_model(sim, plan, halves=True))
    sm = stage_model(sim, plan)
    p2p, dp_bw = sim.link_bandwidths(plan)
    start = pipedream_partition(sim.layer_costs(plan), plan.num_stages, num_microbatches=plan.num_microbatches,
                                dp=plan.dp, p2p_Bps=p2p, dp_Bps=dp_bw,
                                grad_bytes_per_param=GRAD_BYTES[plan.precision])
    return vpipe_partition(sm, start)


__all__ = ["MEMORY_PARTITIONERS", "MemoryPlan", "StagePlan", "dawnpiper_partition", "memory_partition",
           "stage_model", "vpipe_partition"]
