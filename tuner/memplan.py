"""Per-stage memory plans: which blocks of a stage keep, recompute or swap their activations.

The two memory-aware partitioners (:mod:`mindpipe.tuner.memsplit`) price a candidate stage — a run
of nodes on one pipeline rank — by the time it takes once it fits in device memory. A *node* is a
unit of the partition with its time, re-run time and boundary bytes; today a transformer block (the
plan's ``layer_memory_policy`` is per block), written generally so that finer units can be fed in.

Everything about memory and swap cost is asked of the simulator (DESIGN.md, one owner per rule):
the stage's memory for a list of policies is its
:class:`~mindpipe.simulator.planning.StageBudget`, the re-run time is
:func:`mindpipe.simulator.build.stage_recompute`'s, and an exposed swap is
:func:`mindpipe.simulator.planning.exposed_swap_s` of the copy time
:meth:`~mindpipe.simulator.simulator.Simulator.swap_copy_s` prices. Two rules choose the policies,
adding one node's change at a time until the stage fits:

* ``vpipe`` (Zhao et al., TPDS'21; BACKGROUND.md §4.2): swap a node when its copy still hides in
  the forward→backward window (no exposed time), else recompute it; nodes ranked by overhead per
  byte saved, ties from the back of the stage (vPipe's ``recompute_ratio`` counts from the back).
* ``dawnpiper`` (Peng et al., 2025, Capuchin-style; BACKGROUND.md §4.3): first every swap that
  hides, then per node the cheaper of recompute and an exposed swap, ranked by bytes saved per
  second of overhead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from mindpipe.simulator.build import stage_recompute
from mindpipe.simulator.costs import LayerCost
from mindpipe.simulator.planning import StageBudget, exposed_swap_s
from mindpipe.traces.layout import LAYER_POLICY

MemoryRule = Literal["vpipe", "dawnpiper"]
LayerPolicy = Literal["keep", "recompute", "swap"]


@dataclass(frozen=True)
class Node:
    """One unit of the partition, per micro-batch on one device.

    Attributes:
        name: Its layer name (``block.3``).
        forward_s: Forward compute (the window a swap copy back hides in).
        time_s: Forward + input gradient + weight gradient.
        recompute_s: Extra time when its activations are recomputed.
        output_bytes: Bytes crossing a stage boundary placed after it.
    """

    name: str
    forward_s: float
    time_s: float
    recompute_s: float
    output_bytes: float


def block_nodes(costs: Sequence[LayerCost]) -> list[Node]:
    """The transformer blocks of a model's per-layer costs as nodes."""
    out = []
    for c in costs:
        if c.kind == "block":
            redo = stage_recompute([c], [LAYER_POLICY["recompute"]])[0]
            out.append(Node(c.name, c.forward_s, c.forward_s + c.backward_input_s + c.backward_weight_s, redo,
                            float(c.output_bytes)))
    return out


@dataclass(frozen=True)
class StagePlan:
    """A stage's policies and its time per micro-batch (``inf`` when nothing makes it fit)."""

    policies: tuple[LayerPolicy, ...]
    time_s: float
    fits: bool


class StageModel:
    """Prices candidate stages of one plan (module docstring).

    Args:
        nodes: The nodes in pipeline order.
        budgets: The simulator's per-stage memory budgets (one stage per rank).
        extra: (forward, total) seconds the first stage's embedding and the last stage's head add,
            as ``{stage: (forward_s, time_s)}``.
        copy_s: Seconds to copy ``n`` bytes one way over the host link (the simulator's price).
        swap_bytes: Bytes one swapped node copies each way per micro-batch.
    """

    def __init__(self, nodes: Sequence[Node], budgets: Sequence[StageBudget], extra: dict[int, tuple[float, float]],
                 copy_s: Callable[[float], float], swap_bytes: float) -> None:
        self.nodes, self.budgets, self.extra = list(nodes), list(budgets), extra
        self.copy_s, self.swap_bytes = copy_s, swap_bytes
        self._memo: dict[tuple[int, int, int, str], StagePlan] = {}
        self._copy: dict[int, float] = {}

    @property
    def num_stages(self) -> int:
        """Stages (pipeline ranks)."""
        return len(self.budgets)

    def _exposed(self, swapped: int, fwd: float, cycle: float) -> float:
        if swapped not in self._copy:
            self._copy[swapped] = self.copy_s(swapped * self.swap_bytes)
        return exposed_swap_s(self._copy[swapped], fwd, cycle)

    def _totals(self, stage: int, lo: int, hi: int) -> tuple[float, float]:
        """(forward, forward + backward) seconds of the stage with every node kept."""
        ef, et = self.extra.get(stage, (0.0, 0.0))
        nodes = self.nodes[lo:hi]
        return ef + sum(n.forward_s for n in nodes), et + sum(n.time_s for n in nodes)

    def _time(self, fwd: float, base: float, redo: float, swapped: int) -> float:
        """Stage time: kept time, re-run forwards, and the swap copy that does not hide."""
        return base + redo + (self._exposed(swapped, fwd, base + redo) if swapped else 0.0)

    def time_of(self, stage: int, lo: int, hi: int, policies: Sequence[LayerPolicy]) -> float:
        """Seconds per micro-batch of stage ``stage`` holding nodes ``lo..hi-1`` under ``policies``."""
        fwd, base = self._totals(stage, lo, hi)
        redo = sum(n.recompute_s for n, p in zip(self.nodes[lo:hi], policies, strict=True) if p == "recompute")
        return self._time(fwd, base, redo, sum(1 for p in policies if p == "swap"))

    def fits(self, stage: int, policies: Sequence[LayerPolicy]) -> bool:
        """True when the stage fits under ``policies`` (the simulator's memory model)."""
        return self.budgets[stage].fits([LAYER_POLICY[p] for p in policies])

    def keep_bytes(self, stage: int, lo: int, hi: int) -> float:
        """The stage's memory with every node kept (for memory-balanced cuts)."""
        return self.budgets[stage].total_bytes([LAYER_POLICY["keep"]] * (hi - lo))

    def plan(self, stage: int, lo: int, hi: int, rule: MemoryRule) -> StagePlan:
        """The stage's policies under ``rule`` and its time (memoised)."""
        key = (stage, lo, hi, rule)
        if key not in self._memo:
            self._memo[key] = self._plan(stage, lo, hi, rule)
        return self._memo[key]

    def _plan(self, stage: int, lo: int, hi: int, rule: MemoryRule) -> StagePlan:
        n = hi - lo
        budget = self.budgets[stage]
        floor: LayerPolicy = "swap" if self.swap_bytes > 0 else "recompute"
        if not self.fits(stage, [floor] * n):  # the least memory any plan of the stage can use
            return StagePlan((floor,) * n, math.inf, False)
        pol: list[LayerPolicy] = ["keep"] * n
        keep = budget.block_bytes(LAYER_POLICY["keep"])
        saved = {"recompute": keep - budget.block_bytes(LAYER_POLICY["recompute"]), "swap": keep}
        nodes = self.nodes[lo:hi]
        fwd, base = self._totals(stage, lo, hi)
        redo, swapped = 0.0, 0

        def time(r: float, k: int) -> float:
            return self._time(fwd, base, r, k)

        while not self.fits(stage, pol):
            now = time(redo, swapped)
            best: tuple[float, int, LayerPolicy] | None = None
            for i in range(n - 1, -1, -1):  # from the back: ties go to the last nodes
                if pol[i] != "keep":
                    continue
                per_byte, p = self._choice(rule, saved, max(0.0, time(redo, swapped + 1) - now),
                                           max(0.0, time(redo + nodes[i].recompute_s, swapped) - now))
                if best is None or per_byte < best[0]:
                    best = (per_byte, i, p)
            if best is None or not math.isfinite(best[0]):
                return StagePlan(tuple(pol), math.inf, False)
            pol[best[1]] = best[2]
            if best[2] == "swap":
                swapped += 1
            else:
                redo += nodes[best[1]].recompute_s
        return StagePlan(tuple(pol), time(redo, swapped), True)

    def _choice(self, rule: MemoryRule, saved: dict[str, float], swap_s: float,
                redo_s: float) -> tuple[float, LayerPolicy]:
        """(overhead seconds per byte saved, policy) for a kept node under ``rule``, given the
        stage's extra time if it were swapped (``swap_s``) or recomputed (``redo_s``)."""
        swap = swap_s / saved["swap"] if self.swap_bytes > 0 and saved["swap"] > 0 else math.inf
        if swap <= 1e-18:
            return 0.0, "swap"  # the copy hides: free for both rules
        redo = redo_s / saved["recompute"] if saved["recompute"] > 0 else math.inf
        if rule == "vpipe":
            return redo, "recompute"
        return (redo, "recompute") if redo <= swap else (swap, "swap")


__all__ = ["LayerPolicy", "MemoryRule", "Node", "StageModel", "StagePlan", "block_nodes"]
