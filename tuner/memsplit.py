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
* ``dawnpiper`` (Peng et al., 2025; BACKGROUND.md §4.3): binary partitioning over stage groups.
  To split nodes lo..hi over stages a..b into a left half of ⌊(b−a)/2⌋ stages and the rest, find
  the compute-balanced cut p_T (per-stage time of the halves as equal as possible) and the
  memory-balanced cut p_M (every node kept: each half's memory as equal a share of its
  capacity as possible); try every cut between them, each half priced by the best plan of its own
  (recursively, memoised), with the Capuchin-style memory plan per stage (rule ``dawnpiper``);
  take the best. DawnPiper's "performance-optimal partition" theorem is what limits the cuts to
  [min(p_T, p_M), max(p_T, p_M)]; when no cut there fits, the rest of the range is tried too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.tuner.memplan import LayerPolicy, MemoryRule, StageModel, StagePlan, block_nodes
from mindpipe.tuner.partition import pipedream_partition

MEMORY_PARTITIONERS: tuple[MemoryRule, ...] = ("vpipe", "dawnpiper")


@dataclass(frozen=True)
class MemoryPlan:
    """A partition with its per-block policy (``Plan.layer_memory_policy``) and per-stage times."""

    partition: list[int]
    policy: list[LayerPolicy]
    stage_time_s: list[float]

    @property
    def fits(self) -> bool:
        """True when every stage fits (its time is finite)."""
        return all(math.isfinite(t) for t in self.stage_time_s)


def stage_model(sim: Simulator, plan: Plan) -> StageModel:
    """The :class:`StageModel` of ``plan`` under ``sim`` (costs, budgets, swap price)."""
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
    return StageModel(block_nodes(costs), budgets, extra, lambda n: sim.swap_copy_s(plan, n),
                      sim.swap_bytes_per_block(plan))


def _bounds(partition: Sequence[int]) -> list[tuple[int, int]]:
    out, lo = [], 0
    for n in partition:
        out.append((lo, lo + n))
        lo += n
    return out


def _assemble(sm: StageModel, partition: list[int], rule: MemoryRule) -> MemoryPlan:
    plans = [sm.plan(s, lo, hi, rule) for s, (lo, hi) in enumerate(_bounds(partition))]
    return MemoryPlan(partition, [p for sp in plans for p in sp.policies], [sp.time_s for sp in plans])


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


class _DawnPiper:
    """The binary partition search (module docstring), memoised on (lo, hi, first stage, end stage)."""

    def __init__(self, sm: StageModel) -> None:
        self.sm = sm
        self.prefix = [0.0]
        for n in sm.nodes:
            self.prefix.append(self.prefix[-1] + n.time_s)
        self.memo: dict[tuple[int, int, int, int], tuple[float, list[int]]] = {}
        # Most nodes each stage can hold at all (every node at its least-memory policy): a range
        # that exceeds its stages' sum cannot fit, whatever the cuts, so it is not searched.
        self.room = [self._room(s) for s in range(sm.num_stages)]

    def _room(self, stage: int) -> int:
        floor = "swap" if self.sm.swap_bytes > 0 else "recompute"
        n = 0
        while n < len(self.sm.nodes) and self.sm.fits(stage, [floor] * (n + 1)):
            n += 1
        return n

    def _time(self, lo: int, hi: int, a: int, b: int) -> float:
        """Every-node-kept time of nodes lo..hi on stages a..b-1, the embedding and head included."""
        extra = sum(self.sm.extra.get(s, (0.0, 0.0))[1] for s in range(a, b))
        return self.prefix[hi] - self.prefix[lo] + extra

    def _group_memory(self, lo: int, hi: int, a: int, b: int) -> float:
        """Share of capacity nodes lo..hi use when kept, spread evenly over stages a..b-1."""
        n, g = hi - lo, b - a
        used = 0.0
        for i, s in enumerate(range(a, b)):
            k = n // g + (1 if i < n % g else 0)
            used += self.sm.keep_bytes(s, 0, k) / self.sm.budgets[s].capacity_bytes
        return used / g

    def cut_points(self, lo: int, hi: int, a: int, b: int) -> tuple[int, int]:
        """(p_T, p_M): the compute-balanced and the memory-balanced cut of nodes lo..hi over a..b."""
        mid = a + (b - a) // 2
        g1, g2 = mid - a, b - mid
        cuts = range(lo + g1, hi - g2 + 1)
        p_t = min(cuts, key=lambda c: (max(self._time(lo, c, a, mid) / g1, self._time(c, hi, mid, b) / g2), c))
        p_m = min(cuts, key=lambda c: (max(self._group_memory(lo, c, a, mid), self._group_memory(c, hi, mid, b)), c))
        return p_t, p_m

    def solve(self, lo: int, hi: int, a: int, b: int) -> tuple[float, list[int]]:
        """(slowest stage time, blocks per stage) for nodes lo..hi on stages a..b-1."""
        key = (lo, hi, a, b)
        if key in self.memo:
            return self.memo[key]
        if hi - lo > sum(self.room[a:b]):
            out = (math.inf, [])
        elif b - a == 1:
            out = (self.sm.plan(a, lo, hi, "dawnpiper").time_s, [hi - lo])
        else:
            mid = a + (b - a) // 2
            p_t, p_m = self.cut_points(lo, hi, a, b)
            window = range(min(p_t, p_m), max(p_t, p_m) + 1)
            out = self._best(lo, hi, a, mid, b, window)
            if not math.isfinite(out[0]):
                out = self._best(lo, hi, a, mid, b, range(lo + mid - a, hi - (b - mid) + 1))
        self.memo[key] = out
        return out

    def _best(self, lo: int, hi: int, a: int, mid: int, b: int, cuts: range) -> tuple[float, list[int]]:
        best: tuple[float, list[int]] = (math.inf, [])
        left_room, right_room = sum(self.room[a:mid]), sum(self.room[mid:b])
        for c in cuts:
            if c - lo > left_room or hi - c > right_room:
                continue
            left, right = self.solve(lo, c, a, mid), self.solve(c, hi, mid, b)
            if not left[1] or not right[1]:
                continue
            t = max(left[0], right[0])
            if not best[1] or t < best[0]:
                best = (t, left[1] + right[1])
        return best


def dawnpiper_partition(sm: StageModel) -> MemoryPlan:
    """DawnPiper's binary, memory-aware partition (module docstring)."""
    n, p = len(sm.nodes), sm.num_stages
    _, part = _DawnPiper(sm).solve(0, n, 0, p)
    if not part:  # nothing fits anywhere: report the compute-balanced split, its stages marked unfit
        part = [n // p + (1 if s < n % p else 0) for s in range(p)]
    return _assemble(sm, part, "dawnpiper")


def memory_partition(name: str, sim: Simulator, plan: Plan) -> MemoryPlan:
    """The named memory-aware partition of ``plan`` (one stage per pipeline rank).

    Raises:
        ContractError: an unknown name, interleaved stages, or more stages than blocks.
    """
    if name not in MEMORY_PARTITIONERS:
        raise ContractError("partition", "partitioner", f"{name!r} is not one of {', '.join(MEMORY_PARTITIONERS)}")
    if plan.num_stages > sim.model.num_layers:
        raise ContractError("partition", "pp", f"{plan.num_stages} stages cannot each hold a block of "
                            f"{sim.model.num_layers}")
    sm = stage_model(sim, plan)
    if name == "dawnpiper":
        return dawnpiper_partition(sm)
    p2p, dp_bw = sim.link_bandwidths(plan)
    start = pipedream_partition(sim.layer_costs(plan), plan.num_stages, num_microbatches=plan.num_microbatches,
                                dp=plan.dp, p2p_Bps=p2p, dp_Bps=dp_bw,
                                grad_bytes_per_param=2 if plan.precision == "fp16" else 4)
    return vpipe_partition(sm, start)


__all__ = ["MEMORY_PARTITIONERS", "MemoryPlan", "StagePlan", "dawnpiper_partition", "memory_partition",
           "stage_model", "vpipe_partition"]
