"""Per-stage memory plans: which blocks of a stage keep, recompute or swap their activations.

The two memory-aware partitioners (:mod:`mindpipe.tuner.memsplit`) price a candidate stage — a run
of units on one pipeline rank — by the time it takes once it fits in device memory. A *node* is a
unit with its time, re-run time and boundary bytes: a transformer block, or one of its two parts
(attention, MLP) when the partition is searched at half-block granularity. Stages are ranges of
*positions*: block indices, or half-block indices (position 2·i is block i's attention part, 2·i + 1
its MLP part); a stage whose range starts or ends inside a block holds that block's ``mlp`` or
``attention`` part (the plan's ``stage_cuts``, :mod:`mindpipe.traces.layout`). The plan has one
policy per block (``layer_memory_policy``), and the simulator and the executor apply a cut block's
policy to both of its parts, so a part's policy is *pinned* from outside: the partitioner chooses it
once for the block and both stages are priced with it.

Everything about memory and swap cost is asked of the simulator (DESIGN.md, one owner per rule):
the stage's memory for a list of policies and parts is its
:class:`~mindpipe.simulator.planning.StageBudget`, the re-run time is
:func:`mindpipe.simulator.build.stage_recompute`'s, and an exposed swap is
:func:`mindpipe.simulator.planning.exposed_swap_s` of the copy time
:meth:`~mindpipe.simulator.simulator.Simulator.swap_copy_s` prices (a swapped part copies what a
swapped block does, as the engine prices it). Two rules choose the policies, adding one unit's
change at a time until the stage fits:

* ``vpipe`` (Zhao et al., TPDS'21; BACKGROUND.md §4.2): swap a unit when its copy still hides in
  the forward→backward window (no exposed time), else recompute it; units ranked by overhead per
  byte saved, ties from the back of the stage (vPipe's ``recompute_ratio`` counts from the back).
* ``dawnpiper`` (Peng et al., 2025, Capuchin-style; BACKGROUND.md §4.3): first every swap that
  hides, then per unit the cheapest per byte saved of re-running its attention core only
  (``selective``), re-running every operator but its GEMMs (``nongemm``; both whole blocks only,
  ``nongemm`` only where ``check_plan`` allows it: tp = 1, no split backward), re-running it whole, and an exposed swap, ranked by seconds of
  overhead per byte saved; a unit may later move on to a policy that frees more. Where nothing fits
  with vPipe's prefetch (a swapped block back whole before the backward and one ahead during it),
  the stage copies its swapped units back as its backwards ask instead (``Plan.swap_copy_back``
  ``lazy``: less memory, the whole copy exposed; :meth:`StageModel.budget`); ``vpipe`` never does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from mindpipe.simulator.build import stage_recompute
from mindpipe.simulator.costs import LayerCost
from mindpipe.simulator.planning import StageBudget, exposed_swap_s
from mindpipe.simulator.work import swap_chain_stall_s, swap_out_tail_s, swap_stream_window_s
from mindpipe.traces.layout import LAYER_POLICY, WHOLE_BLOCK_ONLY, BlockPart

MemoryRule = Literal["vpipe", "dawnpiper"]
LayerPolicy = Literal["keep", "selective", "nongemm", "recompute", "swap"]
Pins = tuple["LayerPolicy | None", "LayerPolicy | None"]
NO_PINS: Pins = (None, None)


@dataclass(frozen=True)
class Node:
    """One unit of the partition, per micro-batch on one device.

    Attributes:
        name: Its layer name (``block.3``, ``block.3.attention``).
        forward_s: Forward compute (the window a swap copy back hides in).
        time_s: Forward + input gradient + weight gradient.
        recompute_s: Extra time when its activations are recomputed (the whole forward again).
        selective_s: Extra time when only its attention core is recomputed (``selective``).
        output_bytes: Bytes crossing a stage boundary placed after it.
        nongemm_s: Extra time when every operator but its GEMMs is recomputed (``nongemm``).
    """

    name: str
    forward_s: float
    time_s: float
    recompute_s: float
    output_bytes: float
    selective_s: float = 0.0
    nongemm_s: float = 0.0


def _node(c: LayerCost) -> Node:
    redo = stage_recompute([c], [LAYER_POLICY["recompute"]])[0]
    sel = stage_recompute([c], [LAYER_POLICY["selective"]])[0]
    ops = stage_recompute([c], [LAYER_POLICY["nongemm"]])[0]
    return Node(c.name, c.forward_s, c.forward_s + c.backward_input_s + c.backward_weight_s, redo,
                float(c.output_bytes), sel, ops)


def block_nodes(costs: Sequence[LayerCost]) -> list[Node]:
    """The transformer blocks of a model's per-layer costs as nodes."""
    return [_node(c) for c in costs if c.kind == "block"]


def part_nodes(costs: Sequence[LayerCost]) -> list[tuple[Node, Node]] | None:
    """(attention, mlp) part nodes of every block (``LayerCost.parts``); None when a block has none."""
    blocks = [c for c in costs if c.kind == "block"]
    if any(c.parts is None for c in blocks):
        return None
    return [(_node(c.parts[0]), _node(c.parts[1])) for c in blocks]  # type: ignore[index]


@dataclass(frozen=True)
class StagePlan:
    """A stage's policies (one per unit, :meth:`StageModel.units`) and its time per micro-batch
    (``inf`` when nothing makes it fit); ``lazy``: its swapped units come back as its backwards ask
    (``Plan.swap_copy_back``), not prefetched."""

    policies: tuple[LayerPolicy, ...]
    time_s: float
    fits: bool
    lazy: bool = False


class StageModel:
    """Prices candidate stages of one plan (module docstring).

    Args:
        nodes: The blocks in pipeline order.
        budgets: The simulator's per-stage memory budgets (one stage per rank).
        extra: (forward, total) seconds the first stage's embedding and the last stage's head add,
            as ``{stage: (forward_s, time_s)}``.
        copy_s: Seconds to copy ``n`` bytes one way over the host link (the simulator's price).
        swap_bytes: Bytes one swapped unit copies each way per micro-batch.
        parts: Each block's (attention, mlp) part nodes: positions are then half blocks.
        nongemm: The plan allows ``nongemm`` (:func:`mindpipe.traces.layout.nongemm_refusal`).
        reread_bytes: Bytes a split backward's W copies back again per swapped unit, on the compute
            stream, so always exposed (:meth:`~mindpipe.simulator.simulator.Simulator.swap_reread_bytes_per_block`;
            0 without a split backward).
    """

    def __init__(self, nodes: Sequence[Node], budgets: Sequence[StageBudget], extra: dict[int, tuple[float, float]],
                 copy_s: Callable[[float], float], swap_bytes: float,
                 parts: Sequence[tuple[Node, Node]] | None = None, nongemm: bool = False,
                 reread_bytes: float = 0.0) -> None:
        self.nodes, self.budgets, self.extra = list(nodes), list(budgets), extra
        self.copy_s, self.swap_bytes, self.nongemm, self.reread_bytes = copy_s, swap_bytes, nongemm, reread_bytes
        self.parts = None if parts is None else list(parts)
        self._memo: dict[tuple[int, int, int, str, Pins], StagePlan] = {}
        self._copy: dict[int, float] = {}
        self._reread: dict[int, float] = {}
        self._lazy: dict[int, StageBudget] = {}

    @property
    def num_stages(self) -> int:
        """Stages (pipeline ranks)."""
        return len(self.budgets)

    @property
    def halves(self) -> bool:
        """True when positions are half blocks (module docstring)."""
        return self.parts is not None

    @property
    def num_positions(self) -> int:
        """Positions a partition splits: blocks, or twice as many half blocks."""
        return len(self.nodes) * (2 if self.halves else 1)

    def position_time(self, i: int) -> float:
        """Forward + backward seconds of position ``i`` (a block, or a part of one)."""
        return self.parts[i // 2][i % 2].time_s if self.parts is not None else self.nodes[i].time_s

    def blocks_started(self, lo: int, hi: int) -> int:
        """Blocks whose first position lies in ``lo..hi-1`` (what ``Plan.partition`` counts)."""
        return (hi + 1) // 2 - (lo + 1) // 2 if self.halves else hi - lo

    def units(self, lo: int, hi: int) -> list[tuple[Node, BlockPart, int]]:
        """(node, part, block index) of what a stage over positions ``lo..hi-1`` holds, in order."""
        if self.parts is None:
            return [(self.nodes[i], "whole", i) for i in range(lo, hi)]
        out: list[tuple[Node, BlockPart, int]] = [(self.parts[lo // 2][1], "mlp", lo // 2)] if lo % 2 else []
        out += [(self.nodes[b], "whole", b) for b in range((lo + 1) // 2, hi // 2)]
        if hi % 2:
            out.append((self.parts[hi // 2][0], "attention", hi // 2))
        return out

    def _copy_of(self, swapped: int) -> float:
        if swapped not in self._copy:
            self._copy[swapped] = self.copy_s(swapped * self.swap_bytes)
        return self._copy[swapped]

    def _reread_of(self, swapped: int) -> float:
        """W's copy back of ``swapped`` units' GEMM inputs under a split backward (0 without one)."""
        if self.reread_bytes <= 0.0:
            return 0.0
        if swapped not in self._reread:
            self._reread[swapped] = self.copy_s(swapped * self.reread_bytes)
        return self._reread[swapped]

    def budget(self, stage: int, lazy: bool = False) -> StageBudget:
        """The stage's memory budget, prefetching its swapped units or (``lazy``) not."""
        if not lazy:
            return self.budgets[stage]
        if stage not in self._lazy:
            self._lazy[stage] = self.budgets[stage].lazy()
        return self._lazy[stage]

    def can_be_lazy(self, stage: int) -> bool:
        """True when copying back as the backwards ask uses less memory on the stage than the
        prefetch: a swap is priced and the schedule prefetches some backward of the stage."""
        return self.swap_bytes > 0 and self.budgets[stage].prefetch > 0

    def _exposed(self, stage: int, swapped: int, fwd: float, stream: float, chain: float, lazy: bool) -> float:
        copy = self._copy_of(swapped)
        return exposed_swap_s(copy, fwd, self.budgets[stage].round_trip_share, stream, swap_out_tail_s(copy, swapped),
                              self._copy_of(1), chain, lazy)

    def _totals(self, stage: int, nodes: Sequence[Node]) -> tuple[float, float]:
        """(forward, forward + backward) seconds of the stage with every unit kept."""
        ef, et = self.extra.get(stage, (0.0, 0.0))
        return ef + sum(n.forward_s for n in nodes), et + sum(n.time_s for n in nodes)

    def _time(self, stage: int, fwd: float, base: float, redo: float, nodes: Sequence[Node],
              policies: Sequence[LayerPolicy], lazy: bool = False) -> float:
        """Stage time: kept time, re-run forwards, the swap copy that does not hide (the copy out
        streams beside the forward from the first swapped unit on: ``swap_stream_window_s``) and,
        under a split backward, W's copy back of its swapped units' GEMM inputs."""
        swaps = [p == "swap" for p in policies]
        if not any(swaps):
            return base + redo
        stream = swap_stream_window_s([n.forward_s for n in nodes], swaps)
        one = self._copy_of(1)
        chain = swap_chain_stall_s([n.time_s - n.forward_s + _REDO[p](n) for n, p in zip(nodes, policies, strict=True)],
                                   [one if on else None for on in swaps]) if sum(swaps) > 1 and not lazy else 0.0
        return base + redo + self._exposed(stage, sum(swaps), fwd, stream, chain, lazy) + self._reread_of(sum(swaps))

    def time_of(self, stage: int, lo: int, hi: int, policies: Sequence[LayerPolicy], lazy: bool = False) -> float:
        """Seconds per micro-batch of stage ``stage`` holding positions ``lo..hi-1`` under ``policies``
        (``lazy``: copying back as the backwards ask)."""
        nodes = [u[0] for u in self.units(lo, hi)]
        fwd, base = self._totals(stage, nodes)
        redo = sum(_REDO[p](n) for n, p in zip(nodes, policies, strict=True))
        return self._time(stage, fwd, base, redo, nodes, policies, lazy)

    def fits(self, stage: int, policies: Sequence[LayerPolicy], parts: Sequence[BlockPart] | None = None,
             lazy: bool = False) -> bool:
        """True when the stage fits under ``policies`` (the simulator's memory model)."""
        return self.budget(stage, lazy).fits([LAYER_POLICY[p] for p in policies], parts)

    def least_memory(self, stage: int, parts: Sequence[BlockPart], lazy: bool = False) -> list[LayerPolicy]:
        """The one policy for every unit with which the stage uses the least memory: swap (nothing
        held per micro-batch, but two swapped blocks back whole during a backward, one ahead, and
        a prefetched one before it, ``StageMemoryModel.redone_bytes``) or recompute (each block's
        input held); where the host memory cannot hold every unit's copies, as many units swapped
        as it holds and the rest recomputed, if that uses less. One that fits comes first."""
        floors: tuple[LayerPolicy, ...] = ("swap", "recompute") if self.swap_bytes > 0 else ("recompute",)
        budget = self.budget(stage, lazy)
        n = len(parts)

        def key(pol: list[LayerPolicy]) -> tuple[bool, float]:  # one that fits first, then the fewest device bytes
            blocks = [LAYER_POLICY[p] for p in pol]
            return not budget.fits(blocks, parts), budget.total_bytes(blocks, parts)

        best = min(([p] * n for p in floors), key=key)
        if self.swap_bytes > 0 and n > 1 and not budget.host_fits([LAYER_POLICY["swap"]] * n, parts):
            # the host cannot hold every unit's copies: as many swapped as it holds, the rest re-run
            swap: LayerPolicy = "swap"
            redo: LayerPolicy = "recompute"
            best = min([best, *([swap] * k + [redo] * (n - k) for k in range(1, n))], key=key)
        return best

    def fits_at_all(self, stage: int, parts: Sequence[BlockPart], lazy_ok: bool = False) -> bool:
        """True when the stage fits with its units at :meth:`least_memory`, prefetching or, where
        ``lazy_ok`` (rule ``dawnpiper``), copying back as the backwards ask."""
        return self.fits(stage, self.least_memory(stage, parts), parts) or (
            lazy_ok and self.can_be_lazy(stage) and self.fits(stage, self.least_memory(stage, parts, True), parts, True))

    def keep_bytes(self, stage: int, lo: int, hi: int) -> float:
        """The stage's memory with every unit of positions ``lo..hi-1`` kept (for memory-balanced cuts)."""
        parts = [u[1] for u in self.units(lo, hi)]
        return self.budgets[stage].total_bytes([LAYER_POLICY["keep"]] * len(parts), parts)

    def plan(self, stage: int, lo: int, hi: int, rule: MemoryRule, pins: Pins = NO_PINS) -> StagePlan:
        """The stage's policies under ``rule`` and its time (memoised). ``pins`` fix the policy of a
        leading ``mlp`` and a trailing ``attention`` part (the cut block's one policy)."""
        key = (stage, lo, hi, rule, pins)
        if key not in self._memo:
            self._memo[key] = self._plan(stage, lo, hi, rule, pins)
        return self._memo[key]

    def _plan(self, stage: int, lo: int, hi: int, rule: MemoryRule, pins: Pins) -> StagePlan:
        """Prefetching, or when nothing fits so and the rule allows an exposed copy (``dawnpiper``),
        copying back as the backwards ask (``lazy``: less memory, the whole copy in the open)."""
        sp = self._plan_as(stage, lo, hi, rule, pins, False)
        if sp.fits or rule != "dawnpiper" or not self.can_be_lazy(stage):
            return sp
        lazy = self._plan_as(stage, lo, hi, rule, pins, True)
        if not lazy.fits:
            return sp
        # without a swapped unit the two copy the same (nothing): the plan needs no lazy stage
        return lazy if "swap" in lazy.policies else dataclasses.replace(lazy, lazy=False)

    def _plan_as(self, stage: int, lo: int, hi: int, rule: MemoryRule, pins: Pins, lazy: bool) -> StagePlan:
        units = self.units(lo, hi)
        n = len(units)
        nodes, parts = [u[0] for u in units], [u[1] for u in units]
        fixed: dict[int, LayerPolicy] = {}
        if n and parts[0] == "mlp" and pins[0] is not None:
            fixed[0] = pins[0]
        if n and parts[-1] == "attention" and pins[1] is not None:
            fixed[n - 1] = pins[1]
        floor = self.least_memory(stage, parts, lazy)
        if not self.fits(stage, [fixed.get(i, floor[i]) for i in range(n)], parts, lazy):  # the least memory it can use
            return StagePlan(tuple(fixed.get(i, floor[i]) for i in range(n)), math.inf, False, lazy)
        pol: list[LayerPolicy] = [fixed.get(i, "keep") for i in range(n)]
        fwd, base = self._totals(stage, nodes)
        redo = sum(nodes[i].recompute_s for i, p in fixed.items() if p == "recompute")

        def time(r: float, policies: Sequence[LayerPolicy]) -> float:
            return self._time(stage, fwd, base, r, nodes, policies, lazy)

        while not self.fits(stage, pol, parts, lazy):
            now = time(redo, pol)
            best: tuple[float, int, LayerPolicy] | None = None
            scores: dict[tuple, tuple[float, LayerPolicy]] = {}  # alike units score alike
            for i in range(n - 1, -1, -1):  # from the back: ties go to the last units
                moves = _MOVES[rule].get(pol[i], ())
                if not moves or i in fixed:
                    continue
                node, part, cur = nodes[i], parts[i], pol[i]
                like = (part, cur, node.recompute_s, node.selective_s, node.nongemm_s)
                if like not in scores:
                    options = []
                    for target in moves:
                        if LAYER_POLICY[target] in WHOLE_BLOCK_ONLY and part != "whole":
                            continue  # the executor refuses these on a cut block
                        if target == "nongemm" and not self.nongemm:
                            continue
                        if target == "swap" and (self.swap_bytes <= 0 or not self.budget(stage, lazy).host_fits(
                                [LAYER_POLICY[p] for p in (*pol[:i], target, *pol[i + 1:])], parts)):
                            continue  # nowhere to swap to, or no room left on the host
                        freed = self._freed(stage, parts, pol, i, target, lazy)
                        if freed <= 0:
                            continue
                        r = redo - _REDO[cur](node) + _REDO[target](node)
                        extra = max(0.0, time(r, [*pol[:i], target, *pol[i + 1:]]) - now)
                        options.append((extra / freed, target))
                    scores[like] = self._choice(rule, options)
                per_byte, p = scores[like]
                if best is None or per_byte < best[0]:
                    best = (per_byte, i, p)
            if best is None or not math.isfinite(best[0]):
                return StagePlan(tuple(pol), math.inf, False, lazy)
            i, target = best[1], best[2]
            redo += _REDO[target](nodes[i]) - _REDO[pol[i]](nodes[i])
            pol[i] = target
        return StagePlan(tuple(pol), time(redo, pol), True, lazy)

    def _freed(self, stage: int, parts: Sequence[BlockPart], pol: Sequence[LayerPolicy], i: int,
               target: LayerPolicy, lazy: bool = False) -> float:
        """Bytes per micro-batch in flight the stage's peak loses when unit ``i`` moves from its
        policy to ``target``: what it keeps per micro-batch (the simulator's memory model); for a
        move to or from swap, the change of the stage's whole peak (a swapped block also comes
        back whole during the backward, ``StageMemoryModel.redone_bytes``) over the micro-batches
        in flight."""
        budget, cur = self.budget(stage, lazy), pol[i]
        if "swap" not in (cur, target):
            return budget.block_bytes(LAYER_POLICY[cur], parts[i]) - budget.block_bytes(LAYER_POLICY[target], parts[i])
        moved = [*pol[:i], target, *pol[i + 1:]]
        return (budget.total_bytes([LAYER_POLICY[p] for p in pol], parts)
                - budget.total_bytes([LAYER_POLICY[p] for p in moved], parts)) / max(1, budget.in_flight)

    @staticmethod
    def _choice(rule: MemoryRule, options: Sequence[tuple[float, LayerPolicy]]) -> tuple[float, LayerPolicy]:
        """(overhead seconds per byte saved, policy) of the move ``rule`` takes for one unit among
        ``options`` ((seconds per byte, policy) of each move the unit may make)."""
        if not options:
            return math.inf, "keep"
        hidden = [o for o in options if o[1] == "swap" and o[0] <= 1e-18]
        if hidden:
            return 0.0, "swap"  # the copy hides: free for both rules
        if rule == "vpipe":  # vPipe swaps only what hides; otherwise it recomputes
            return next((o for o in options if o[1] == "recompute"), (math.inf, "keep"))
        return min(options, key=lambda o: (o[0], _STRENGTH[o[1]]))


# The moves each rule makes from a unit's current policy, each freeing more memory: vPipe chooses
# per layer among keep, recompute and swap (Zhao et al. TPDS'21); DawnPiper optimises per operator
# (Peng et al. 2025), which on a block includes re-running only the attention core (Q·Kᵀ, softmax,
# dropout, ·V: the ops that save the most bytes per second re-run, Korthikanti et al. 2022 §5) —
# the block policy ``selective`` — and every operator but the GEMMs (``nongemm``: the attention core
# with the LayerNorms, GeLU, dropouts and residual adds, whose outputs hold most of a block's bytes for
# a small share of its forward) before re-running the whole block or swapping it. A swapped unit
# may still move on to recompute: a swapped block comes back whole, one ahead of the backward
# (:meth:`StageModel.least_memory`), so on a stage with few micro-batches in flight a re-run can free more.
# Under DawnPiper a recomputed unit may move on to swap: a re-run block keeps its input per micro-batch
# in flight, a swapped one nothing, so on a stage with many in flight (or copying back as asked,
# ``Plan.swap_copy_back``) swapping frees more. Every move lowers the stage's peak (``_freed`` > 0),
# so no unit goes round.
_MOVES: dict[MemoryRule, dict[LayerPolicy, tuple[LayerPolicy, ...]]] = {
    "vpipe": {"keep": ("swap", "recompute"), "swap": ("recompute",)},
    "dawnpiper": {"keep": ("swap", "selective", "nongemm", "recompute"), "selective": ("swap", "nongemm", "recompute"),
                  "nongemm": ("swap", "recompute"), "recompute": ("swap",), "swap": ("recompute",)},
}
_STRENGTH: dict[LayerPolicy, int] = {"keep": 0, "selective": 1, "nongemm": 2, "recompute": 3, "swap": 4}
# Seconds each policy re-runs per micro-batch.
_REDO: dict[LayerPolicy, Callable[[Node], float]] = {
    "keep": lambda n: 0.0, "swap": lambda n: 0.0, "selective": lambda n: n.selective_s,
    "nongemm": lambda n: n.nongemm_s, "recompute": lambda n: n.recompute_s}


__all__ = ["NO_PINS", "LayerPolicy", "MemoryRule", "Node", "Pins", "StageModel", "StagePlan", "block_nodes",
           "part_nodes"]
