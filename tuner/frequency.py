"""SM-clock planning: a Perseus-style time–energy frontier and EnvPipe's heuristic per stage, and per-action clocks.

The first two work on the iteration DAG of :mod:`mindpipe.tuner.clock_dag` with one locked clock per
pipeline rank (``stage_clocks_mhz`` equal on a rank's virtual stages: the executor locks a
device once). Perseus switches per instruction: ``perseus_action`` plans that
(``action_clocks_mhz``, which the executor switches around every action from a clock thread,
:class:`mindpipe.executor.clocks.ActionClocks`) with :mod:`mindpipe.tuner.clock_actions`, which also
bounds what any clock plan can save.

* **Perseus** (SOSP'24, ml-energy/lowtime): the time–energy frontier. Perseus starts from all
  computations at their slowest useful clock and repeatedly shortens the critical DAG by a time
  quantum at the least energy (Phillips–Dessouky min-cut). With one clock per rank the decision
  is a vector of pp clocks, and we walk the same frontier from the other end: from every rank at
  f_max, repeatedly lower by one clock step the rank whose step saves energy at the least added
  iteration time per joule (steps that add no time first), down to each rank's energy-optimal
  clock; the Pareto filter of the walk and of every one-step neighbour it priced is the frontier. This greedy is not proven exact (a min-cut step
  can slow several ranks at once); ``tests/tuner/test_frequency_planning.py`` compares it with
  exhaustive search on small pipelines.
* **EnvPipe** (ATC'23): run every rank at its energy-optimal clock (the bottom of the U-shaped
  energy curve), then raise the clocks of critical ranks — the rank whose one-step raise shortens
  the iteration most — until the iteration time is back within the baseline envelope.

The chosen plans are re-simulated by the engine; those are the figures reported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.frequency import frequency_spec
from mindpipe.traces.layout import stage_to_rank
from mindpipe.tuner.clock_actions import ActionGrid, absorb_slack, energy_bound, lp_plan
from mindpipe.tuner.clock_dag import ClockDag, DagPoint

ClockMethod = Literal["perseus", "envpipe", "default", "perseus_action"]
# What ``tune --clocks`` offers, every one a plan the executor runs: one locked clock per rank
# (``perseus``, ``envpipe``), none (``default``), or ``perseus_action``: ``action_clocks_mhz``, a
# clock per forward/backward of each micro-batch (:mod:`mindpipe.tuner.clock_actions`).
CLOCK_METHODS: tuple[str, ...] = ("perseus", "envpipe", "default", "perseus_action")


@dataclass(frozen=True)
class ClockPlan:
    """The outcome of a clock planner (engine figures for the baseline and the chosen plan).

    Attributes:
        method: ``perseus``, ``envpipe`` or ``default``.
        plan: The plan with ``stage_clocks_mhz`` (``action_clocks_mhz`` for ``perseus_action``) set.
        baseline_s, baseline_energy_j: Iteration time and device energy at default clocks.
        iteration_s, energy_j: The same with the chosen clocks.
        frontier: Perseus's (DAG) time–energy frontier, fastest first; empty for the others.
    """

    method: str
    plan: Plan
    baseline_s: float
    baseline_energy_j: float
    iteration_s: float
    energy_j: float
    frontier: list[DagPoint] = field(default_factory=list)
    bounds: dict[str, float] = field(default_factory=dict)

    @property
    def slowdown(self) -> float:
        """Relative iteration-time increase over the baseline."""
        return self.iteration_s / self.baseline_s - 1.0

    @property
    def energy_saving(self) -> float:
        """Relative device-energy saving over the baseline."""
        return 1.0 - self.energy_j / self.baseline_energy_j

    def to_dict(self) -> dict:
        """JSON-ready summary (per-action clocks as min/mean/max MHz per stage and phase)."""
        actions = self.plan.action_clocks_mhz
        summary = None if actions is None else [
            {ph: [min(row), round(sum(row) / len(row)), max(row)] for ph, row in zip(("forward", "backward"), pair,
                                                                                    strict=True)}
            for pair in actions]
        return {"method": self.method, "stage_clocks_mhz": self.plan.stage_clocks_mhz,
                "action_clocks_min_mean_max_mhz": summary, "energy_saving_bounds": self.bounds,
                "baseline_iteration_s": self.baseline_s, "baseline_energy_j": self.baseline_energy_j,
                "iteration_s": self.iteration_s, "energy_j": self.energy_j, "slowdown": self.slowdown,
                "energy_saving": self.energy_saving,
                "frontier": [{"rank_clocks_mhz": list(p.rank_clocks_mhz), "iteration_s": p.iteration_s,
                              "energy_j": p.energy_j} for p in self.frontier]}


def clock_grid(sim: Simulator, stride: int = 1) -> list[int]:
    """Supported clocks from f_max down to the minimum, every ``stride`` steps (descending)."""
    return frequency_spec(sim.device.name).clocks(stride=stride)


def energy_optimal_index(dag: ClockDag, grid: Sequence[int]) -> list[int]:
    """Per rank, the grid index of the clock minimising its compute energy (the U's bottom)."""
    out = []
    for r in range(dag.pp):
        best, best_e = 0, float("inf")
        for k, mhz in enumerate(grid):
            e = 0.0
            for s, rank in enumerate(dag.stage_to_rank):
                if rank != r:
                    continue
                fwd, bwd = dag.table.at(s, mhz)
                cf, cb = dag.compute_f[s] * fwd.stretch, (dag.compute_i[s] + dag.compute_w[s]) * bwd.stretch
                e += dag.power.phase_power_w(mhz, fwd) * cf + dag.power.phase_power_w(mhz, bwd) * cb
                # The step's data-parallel copies, per micro-batch.
                e += dag.power.busy_power_w(mhz, 0.0) * dag.copies.stage_total[s] / dag.num_microbatches
            if e < best_e:
                best, best_e = k, e
        out.append(best)
    return out


def pareto(points: Sequence[DagPoint]) -> list[DagPoint]:
    """Points no other point beats on both time and energy, fastest first."""
    out: list[DagPoint] = []
    for p in sorted(points, key=lambda p: (p.iteration_s, p.energy_j)):
        if not out or p.energy_j < out[-1].energy_j:
            out.append(p)
    return out


def perseus_frontier(dag: ClockDag, grid: Sequence[int]) -> list[DagPoint]:
    """The time–energy frontier by greedy descent from f_max (module docstring), fastest first."""
    floor = energy_optimal_index(dag, grid)
    idx = [0] * dag.pp
    cur = dag.evaluate([grid[i] for i in idx])
    seen = [cur]  # the walk and every one-step neighbour it priced
    while True:
        best: tuple[float, float, int, DagPoint] | None = None
        for r in range(dag.pp):
            if idx[r] >= floor[r]:
                continue
            trial = list(idx)
            trial[r] += 1
            p = dag.evaluate([grid[i] for i in trial])
            seen.append(p)
            saved = cur.energy_j - p.energy_j
            if saved <= 0:
                continue
            key = (max(p.iteration_s - cur.iteration_s, 0.0) / saved, -saved, r, p)
            if best is None or key[:3] < best[:3]:
                best = key
        if best is None:
            break
        idx[best[2]] += 1
        cur = best[3]
    return pareto(seen)


def envpipe_clocks(dag: ClockDag, grid: Sequence[int], target_s: float) -> tuple[int, ...]:
    """EnvPipe: energy-optimal clocks, critical ranks raised until the time is within ``target_s``."""
    idx = energy_optimal_index(dag, grid)
    cur = dag.evaluate([grid[i] for i in idx])
    while cur.iteration_s > target_s and any(i > 0 for i in idx):
        best: tuple[float, float, int, DagPoint] | None = None
        for r in range(dag.pp):
            if idx[r] == 0:
                continue
            trial = list(idx)
            trial[r] -= 1
            p = dag.evaluate([grid[i] for i in trial])
            key = (p.iteration_s, p.energy_j, r, p)
            if best is None or key[:3] < best[:3]:
                best = key
        if best is None:
            break
        if best[0] >= cur.iteration_s:
            # No single raise shortens the iteration (two ranks tie on the critical path): raise
            # the slowest-clocked rank, as EnvPipe raises every critical unit.
            r = max(range(dag.pp), key=lambda k: idx[k])
            idx[r] -= 1
            cur = dag.evaluate([grid[i] for i in idx])
        else:
            idx[best[2]] -= 1
            cur = best[3]
    return tuple(grid[i] for i in idx)


def with_clocks(plan: Plan, rank_clocks: Sequence[int]) -> Plan:
    """``plan`` with each stage at its rank's clock."""
    return dataclasses.replace(plan, stage_clocks_mhz=[int(rank_clocks[r]) for r in stage_to_rank(plan)])


def plan_clocks(sim: Simulator, plan: Plan, method: str = "perseus", max_slowdown: float = 0.01,
                stride: int = 1) -> ClockPlan:
    """Choose per-stage clocks for ``plan`` with ``method`` within ``max_slowdown`` of default clocks.

    Perseus: the least-energy frontier point whose engine-simulated iteration is within the
    slowdown (points are tried from least energy up; the DAG ignores contention, so a point may
    fail the engine's check). EnvPipe: its heuristic at the slowdown's target, raised further on
    the DAG while the engine still finds it too slow.

    Raises:
        ContractError: unknown method, or a device without frequency data.
    """
    if method not in CLOCK_METHODS:
        raise ContractError("tune", "clocks", f"clocks={method!r} must be one of {', '.join(CLOCK_METHODS)}")
    if method == "perseus_action":
        return plan_action_clocks(sim, plan, max_slowdown, stride)
    base_plan = dataclasses.replace(plan, stage_clocks_mhz=None, action_clocks_mhz=None)
    base = sim.run(base_plan)
    base_t, base_e = base.iteration_time_s, base.extra.device_energy_j
    if method == "default":
        return ClockPlan(method, base_plan, base_t, base_e, base_t, base_e)
    frequency_spec(sim.device.name, "cluster")
    grid = clock_grid(sim, stride)
    dag = ClockDag.of(sim, base_plan, grid)
    limit = base_t * (1.0 + max_slowdown)
    frontier: list[DagPoint] = []
    if method == "perseus":
        frontier = perseus_frontier(dag, grid)
        candidates = sorted((p for p in frontier if p.iteration_s <= limit), key=lambda p: p.energy_j)
        for p in candidates:
            trial = with_clocks(base_plan, p.rank_clocks_mhz)
            r = sim.run(trial)
            if r.iteration_time_s <= limit:
                return ClockPlan(method, trial, base_t, base_e, r.iteration_time_s, r.extra.device_energy_j, frontier)
        return ClockPlan(method, with_clocks(base_plan, [grid[0]] * dag.pp), base_t, base_e, base_t, base_e, frontier)
    target = limit
    for _ in range(len(grid)):
        clocks = envpipe_clocks(dag, grid, target)
        trial = with_clocks(base_plan, clocks)
        r = sim.run(trial)
        if r.iteration_time_s <= limit:
            return ClockPlan(method, trial, base_t, base_e, r.iteration_time_s, r.extra.device_energy_j)
        target -= r.iteration_time_s - limit  # the DAG was optimistic by about this much
    return ClockPlan(method, with_clocks(base_plan, [grid[0]] * dag.pp), base_t, base_e, base_t, base_e)


def plan_action_clocks(sim: Simulator, plan: Plan, max_slowdown: float = 0.01, stride: int = 1) -> ClockPlan:
    """Per-action clocks (``action_clocks_mhz``) within ``max_slowdown`` of default clocks.

    Candidates: the rounded optimum of the time–cost LP (:func:`mindpipe.tuner.clock_actions.lp_plan`,
    exact before rounding) and slack absorbed (:func:`~mindpipe.tuner.clock_actions.absorb_slack`)
    from every action at f_max and from the per-stage Perseus plan; the one the engine finds
    cheapest within the slowdown is kept (the per-stage plan itself if none beats it). When the
    engine finds a candidate too slow (the DAG ignores contention) its DAG deadline is cut by the
    excess and it is redone. ``bounds`` holds savings no clock plan exceeds on the DAG: the LP
    optimum (``lp_exact``) and :func:`~mindpipe.tuner.clock_actions.energy_bound`'s two.
    """
    stage = plan_clocks(sim, plan, "perseus", max_slowdown, stride)
    base_plan = dataclasses.replace(stage.plan, stage_clocks_mhz=None)
    grid = clock_grid(sim, stride)
    dag = ClockDag.of(sim, base_plan, grid)
    ag = ActionGrid.of(dag, grid)
    limit = stage.baseline_s * (1.0 + max_slowdown)
    dag_base = dag.evaluate([grid[0]] * dag.pp).energy_j
    window, free = energy_bound(ag, limit)
    bounds = {"rank_window": 1.0 - window / dag_base, "free_time": 1.0 - free / dag_base}
    exact = lp_plan(ag, limit - dag.tail_s)
    if exact is not None:
        bounds["lp_exact"] = 1.0 - exact[1] / dag_base
    best = dataclasses.replace(stage, method="perseus_action", bounds=bounds)
    seeds: list[list[int] | None] = [None, [0] * len(ag.nodes)]  # None: the LP's rounded optimum
    if stage.plan.stage_clocks_mhz is not None:
        first = {r: s for s, r in reversed(list(enumerate(stage_to_rank(plan))))}
        seeds.append(ag.index_of([stage.plan.stage_clocks_mhz[first[r]] for r in range(dag.pp)]))
    for seed in seeds:
        target = limit - dag.tail_s
        for attempt in range(5):
            if seed is None:
                solved = exact if attempt == 0 else lp_plan(ag, target)
                if solved is None:
                    break
                idx = solved[0]
            elif ag.starts(seed)[1] > target:
                break
            else:
                idx = absorb_slack(ag, seed, target)
            trial = dataclasses.replace(base_plan, action_clocks_mhz=ag.action_clocks(idx))
            r = sim.run(trial)
            if r.iteration_time_s <= limit:
                if r.extra.device_energy_j < best.energy_j:
                    best = ClockPlan("perseus_action", trial, stage.baseline_s, stage.baseline_energy_j,
                                     r.iteration_time_s, r.extra.device_energy_j, bounds=bounds)
                break
            target -= r.iteration_time_s - limit  # the DAG was optimistic by about this much
    return best


__all__ = [
    "CLOCK_METHODS",
    "ClockMethod",
    "ClockPlan",
    "clock_grid",
    "energy_optimal_index",
    "envpipe_clocks",
    "pareto",
    "perseus_frontier",
    "plan_action_clocks",
    "plan_clocks",
    "with_clocks",
]
