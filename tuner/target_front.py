"""``tune --objective carbon_to_target``: the time-vs-carbon front over plans, clocks and start times.

After the plan search (each plan priced by :mod:`mindpipe.tuner.target` at its own cleanest
schedule), the best few plans and the throughput-optimal one become **candidates**, each at default
clocks and with per-stage SM clocks (:func:`mindpipe.tuner.frequency.plan_clocks`, Perseus unless
another planner is named, none at all with ``--clocks default``: :func:`front_clocks`; re-simulated by
the engine, whose facility energy is what is priced). Each candidate is
then placed in time for every latest start ``d`` = 0, 1, …, window hours (the cleanest schedule of
a job that may start up to ``d`` hours late, :func:`mindpipe.simulator.timeshift.schedule`), which
gives one **point** per (plan, clocks, start): hours to target (computing + waiting) and gCO2.

* the **front** is the points no other beats on both time to target (waiting included) and gCO2;
* the **reference** is the throughput-optimal plan at default clocks started now (``d = 0``);
* the **choice** is the least-gCO2 point whose compute hours (waiting excluded) are within
  ``max_time_increase`` of the reference's.

Without an hourly series there is one start (the annual intensity) and the front is over plans and
clocks only. Outputs: ``target_front.csv``, ``target_front.png``, ``target.json``; the chosen plan
(with its clocks) is written to ``best_plan.json``.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindpipe.simulator.carbon import stamp
from mindpipe.simulator.energy import J_PER_KWH
from mindpipe.simulator.simulator import Simulator
from mindpipe.simulator.timeshift import Window, schedule
from mindpipe.traces.atomic import figure, open_output, save_figure, write_text
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.units import CARBON_UNITS, scaled_unit
from mindpipe.tuner.frequency import plan_clocks
from mindpipe.tuner.objectives import pareto_front
from mindpipe.tuner.records import ScoredRecord
from mindpipe.tuner.target import Placement, ToTarget, TrainingTarget, to_target

FRONT_CLOCK_METHODS = ("default", "perseus", "envpipe")
DEFAULT_FRONT_PLANNER = "perseus"  # what the front tries besides default clocks when no method is named


def front_clocks(method: str | None) -> tuple[str, ...]:
    """The clock methods the front prices for a ``--clocks`` value (the one owner of that rule).

    ``None`` (not given): default clocks and :data:`DEFAULT_FRONT_PLANNER`; ``"default"``: default
    clocks only — the GPUs stay at their default clock and no clocks are planned; ``"perseus"`` or
    ``"envpipe"``: default clocks and that planner.

    Raises:
        ContractError: another method (naming ``--clocks``).
    """
    if method is None:
        return ("default", DEFAULT_FRONT_PLANNER)
    if method not in FRONT_CLOCK_METHODS:
        raise ContractError("--clocks", None, f"{method!r} must be one of {', '.join(FRONT_CLOCK_METHODS)}")
    return ("default",) if method == "default" else ("default", method)


@dataclass(frozen=True)
class FrontConfig:
    """How wide the front's search is (bounded: ``top_plans`` + 1 plans × clocks × starts).

    Attributes:
        clocks: Clock methods per plan (``default`` always included; ``("default",)``: no clock
            planning). :func:`front_clocks` maps a ``--clocks`` value to it.
        top_plans: Best plans of the search (by gCO2 to target) to try clocks and starts on.
        max_slowdown: Per-iteration slowdown the clock planner may cost; the planner also runs at
            ``max_time_increase`` (the whole budget of the choice), so the front holds both.
        max_time_increase: Compute hours to target the choice may add over the reference.
        stride: Clock steps per planner step (:func:`mindpipe.tuner.frequency.plan_clocks`).
    """

    clocks: tuple[str, ...] = ("default", "perseus")
    top_plans: int = 3
    max_slowdown: float = 0.01
    max_time_increase: float = 0.03
    stride: int = 4

    def __post_init__(self) -> None:
        if "default" not in self.clocks:
            object.__setattr__(self, "clocks", ("default", *self.clocks))
        if self.top_plans < 1:
            raise ContractError("tune", "top_plans", f"{self.top_plans} must be >= 1")
        for key in ("max_slowdown", "max_time_increase"):
            v = getattr(self, key)
            if not (math.isfinite(v) and v >= 0):
                raise ContractError("tune", key, f"{v} must be a finite number >= 0")


@dataclass(frozen=True)
class Candidate:
    """A plan at some clocks: engine-simulated iteration time and facility energy per iteration."""

    plan: Plan
    clocks: str
    iteration_time_s: float
    energy_j: float
    intensity_g_per_kwh: float  # the cluster's annual intensity (used without an hourly series)
    throughput_optimal: bool
    name: str
    slowdown_limit: float = 0.0  # the per-iteration slowdown the clock planner was given


@dataclass(frozen=True)
class FrontPoint:
    """A candidate placed in time: its cost to target and its schedule (None: annual intensity)."""

    candidate: Candidate
    latest_start_hours: float
    cost: ToTarget
    start: str | None
    run_hours: tuple[str, ...]

    @property
    def hours_to_target(self) -> float:
        """Hours from the window's start to the target (computing and waiting)."""
        return self.cost.compute_hours + self.cost.wait_hours

    def row(self) -> dict[str, Any]:
        """A flat JSON row (``target.json``): ``stage_clocks_mhz`` a list of MHz or None (default clocks),
        ``start`` None without an hourly series. :meth:`csv_row` is the same row for ``target_front.csv``."""
        c = self.candidate
        clocks = c.plan.stage_clocks_mhz
        return {"plan": c.name, "clocks": c.clocks, "clock_slowdown_limit": c.slowdown_limit,
                "throughput_optimal": c.throughput_optimal,
                "stage_clocks_mhz": list(clocks) if clocks else None,
                "global_batch_size": c.plan.global_batch_size, "iteration_time_s": c.iteration_time_s,
                "energy_per_iteration_j": c.energy_j, "latest_start_hours": self.latest_start_hours,
                "start": self.start, "iterations_to_target": self.cost.iterations,
                "compute_hours": self.cost.compute_hours, "wait_hours": self.cost.wait_hours,
                "hours_to_target": self.hours_to_target, "energy_kwh": self.cost.energy_kwh,
                "intensity_g_per_kwh": self.cost.intensity_g_per_kwh, "carbon_gco2": self.cost.carbon_gco2,
                "samples": self.cost.samples}

    def csv_row(self) -> dict[str, Any]:
        """:meth:`row` for a CSV cell each: the clocks as a JSON list in one cell, a missing value empty."""
        row = self.row()
        clocks = row["stage_clocks_mhz"]
        return {**row, "stage_clocks_mhz": json.dumps(clocks) if clocks else "", "start": row["start"] or ""}


def _label(plan: Plan) -> str:
    return (f"dp{plan.dp} tp{plan.tp} pp{plan.pp}" + (f" cp{plan.cp}" if plan.cp > 1 else "")
            + f" mb{plan.micro_batch_size} gb{plan.global_batch_size} "
            f"{plan.schedule}" + (f" v{plan.virtual_stages}" if plan.virtual_stages > 1 else ""))


def candidates(sim: Simulator, plans: Sequence[Plan], fastest: int, cfg: FrontConfig,
               skipped: list[str] | None = None) -> list[Candidate]:
    """Every plan at every clock method of ``cfg`` (``plans[fastest]`` is the throughput-optimal one).

    A device without frequency data gets default clocks only; why goes to ``skipped``.
    """
    out = []
    limits = sorted({cfg.max_slowdown, cfg.max_time_increase})
    for i, plan in enumerate(plans):
        seen: list[Any] = []
        for method in cfg.clocks:
            for lim in ([0.0] if method == "default" else limits):
                try:
                    chosen = plan_clocks(sim, plan, method, lim, cfg.stride).plan
                except ContractError as exc:  # no frequency data for this device: default clocks only
                    if skipped is not None and str(exc) not in skipped:
                        skipped.append(str(exc))
                    break
                if (method != "default" and not chosen.stage_clocks_mhz) or chosen.stage_clocks_mhz in seen:
                    continue  # no clocks found, or the same clocks as at a smaller limit
                seen.append(chosen.stage_clocks_mhz)
                r = sim.run(chosen)
                if r.energy_j is None or not r.iteration_time_s:
                    continue
                ci = (r.carbon_gco2 or 0.0) / (r.energy_j / J_PER_KWH) if r.energy_j > 0 else 0.0
                out.append(Candidate(chosen, method, r.iteration_time_s, r.energy_j, ci, i == fastest, _label(plan),
                                     lim))
    return out


def _latest_starts(window: Window) -> list[float]:
    hours = [float(d) for d in range(math.floor(window.hours) + 1)]
    return hours if hours[-1] == window.hours else [*hours, window.hours]


def place(cands: Sequence[Candidate], target: TrainingTarget, placement: Placement | None,
          latest: Sequence[float] | None = None) -> list[FrontPoint]:
    """Every candidate at every latest start (default: each hour of the window); see the module docstring.

    A candidate whose job runs past the series at some latest start is left out there.
    """
    out: list[FrontPoint] = []
    for c in cands:
        gb = c.plan.global_batch_size
        if placement is None:
            cost = to_target(target, gb, c.iteration_time_s, c.energy_j, c.intensity_g_per_kwh)
            out.append(FrontPoint(c, 0.0, cost, None, ()))
            continue
        w = placement.window
        compute_s = target.iterations(gb) * c.iteration_time_s
        for d in (latest if latest is not None else _latest_starts(w)):
            sub = Window(w.start, min(w.end, w.start + dt.timedelta(hours=d)), w.source)
            try:
                sched = schedule(placement.series, sub, compute_s, placement.interruptible)
            except ContractError:
                continue
            cost = to_target(target, gb, c.iteration_time_s, c.energy_j, sched=sched)
            out.append(FrontPoint(c, d, cost, stamp(sched.start), tuple(sched.run_hours())))
    return out


def front(points: Sequence[FrontPoint]) -> list[FrontPoint]:
    """The points no other beats on both hours to target and gCO2 (fastest first)."""
    rows = [{"neg_hours": -p.hours_to_target, "carbon": p.cost.carbon_gco2} for p in points]
    return [points[i] for i in pareto_front(rows, maximize="neg_hours", minimize="carbon")]


def reference(points: Sequence[FrontPoint]) -> FrontPoint:
    """The throughput-optimal plan at default clocks, started now (latest start 0).

    Raises:
        ContractError: no such point (the throughput-optimal plan's job runs past the series).
    """
    for p in points:
        if p.candidate.throughput_optimal and p.candidate.clocks == "default" and p.latest_start_hours == 0:
            return p
    raise ContractError("tune", "carbon_to_target", "the throughput-optimal plan started now could not be priced "
                                                    "(its job runs past the carbon series)")


def choose(points: Sequence[FrontPoint], ref: FrontPoint, max_time_increase: float) -> FrontPoint:
    """The least-gCO2 point within ``max_time_increase`` more compute hours than ``ref`` (ties: sooner)."""
    cap = ref.cost.compute_hours * (1.0 + max_time_increase) * (1 + 1e-12)
    ok = [p for p in points if p.cost.compute_hours <= cap]
    return min(ok, key=lambda p: (p.cost.carbon_gco2, p.hours_to_target))


def saving(chosen: FrontPoint, ref: FrontPoint) -> dict[str, float]:
    """Relative gCO2 saving (to target, and per processed sample) and compute-time increase."""
    per = chosen.cost.carbon_gco2 / chosen.cost.samples
    per_ref = ref.cost.carbon_gco2 / ref.cost.samples
    return {"carbon_saving_fraction": 1.0 - chosen.cost.carbon_gco2 / ref.cost.carbon_gco2,
            "carbon_per_sample_saving_fraction": 1.0 - per / per_ref,
            "energy_saving_fraction": 1.0 - chosen.cost.energy_kwh / ref.cost.energy_kwh,
            "compute_time_increase_fraction": chosen.cost.compute_hours / ref.cost.compute_hours - 1.0}


@dataclass(frozen=True)
class TargetChoice:
    """What the front chose: the point, the reference it is judged against, the front's size, and why
    only default clocks were priced (``clock_note``, when so)."""

    chosen: FrontPoint
    reference: FrontPoint
    front_points: int
    priced_points: int
    clock_note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` keys of ``carbon_to_target`` (README: "carbon to target")."""
        chosen, ref = self.chosen, self.reference
        out: dict[str, Any] = {
            "start": chosen.start, "run_hours": list(chosen.run_hours), "carbon_gco2": chosen.cost.carbon_gco2,
            "carbon_gco2_if_now": ref.cost.carbon_gco2, "energy_kwh": chosen.cost.energy_kwh,
            "energy_kwh_if_now": ref.cost.energy_kwh, "compute_hours": chosen.cost.compute_hours,
            "compute_hours_if_now": ref.cost.compute_hours, "wait_hours": chosen.cost.wait_hours,
            "iterations_to_target": chosen.cost.iterations, "clock_method": chosen.candidate.clocks,
            "stage_clocks_mhz": chosen.candidate.plan.stage_clocks_mhz, **saving(chosen, ref),
            "front_points": self.front_points, "priced_points": self.priced_points}
        if self.clock_note is not None:
            out["clock_note"] = self.clock_note
        return out


def plot(points: Sequence[FrontPoint], fr: Sequence[FrontPoint], ref: FrontPoint, chosen: FrontPoint,
         path: Path, title: str = "") -> None:
    """Hours to target vs gCO2: every point (by clocks), the front, the reference and the choice."""
    # the unit that puts the values between 1 and 1000 (gCO2 of a small job, tCO2 of a large one)
    unit, per = scaled_unit([p.cost.carbon_gco2 for p in points], CARBON_UNITS)
    fig, ax = figure(figsize=(6.5, 4.2))
    for clocks, marker in (("default", "o"), ("perseus", "^"), ("envpipe", "s")):
        pts = [p for p in points if p.candidate.clocks == clocks]
        if pts:
            ax.scatter([p.hours_to_target for p in pts], [p.cost.carbon_gco2 / per for p in pts], s=10,
                       marker=marker, alpha=0.35, label=f"{clocks} clocks")
    ax.plot([p.hours_to_target for p in fr], [p.cost.carbon_gco2 / per for p in fr], "k.-", label="front")
    ax.plot([ref.hours_to_target], [ref.cost.carbon_gco2 / per], "rs", label="throughput-optimal, now")
    ax.plot([chosen.hours_to_target], [chosen.cost.carbon_gco2 / per], "g*", markersize=13,
            label=f"chosen: {saving(chosen, ref)['carbon_saving_fraction']:.1%} less gCO2")
    ax.set_xlabel("hours to target (computing + waiting)")
    ax.set_ylabel(f"{unit} to target")
    ax.set_title(title or "carbon to target: plans x clocks x start times", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)


def select_plans(records: Sequence[ScoredRecord], top: int) -> list[Plan]:
    """The throughput-optimal feasible plan first, then the ``top`` best by the objective (no repeats).

    Raises:
        ContractError: no feasible simulated plan.
    """
    ok = [r for r in records if r.feasible and r.plan is not None and r.metrics.throughput_samples_per_s]
    if not ok:
        raise ContractError("tune", "carbon_to_target", "no feasible simulated plan to place in time")
    fastest = max(ok, key=lambda r: (r.metrics.throughput_samples_per_s or 0.0, -r.index))
    ranked = sorted(ok, key=lambda r: (r.value if r.value is not None else math.inf, r.index))[:top]
    return [r.plan for r in [fastest, *[r for r in ranked if r is not fastest]] if r.plan is not None]


def run_front(sim: Simulator, records: Sequence[ScoredRecord], target: TrainingTarget, placement: Placement | None,
              cfg: FrontConfig, out: Path, plots: bool = True) -> TargetChoice:
    """Candidates from the sweep's records, the front, the choice; writes the outputs (module docstring).

    Returns:
        The choice (``.chosen.candidate.plan``: the chosen plan, with its clocks).

    Raises:
        ContractError: no feasible simulated plan, or the reference cannot be priced.
    """
    skipped: list[str] = []
    points = place(candidates(sim, select_plans(records, cfg.top_plans), 0, cfg, skipped), target, placement)
    ref = reference(points)
    best = choose(points, ref, cfg.max_time_increase)
    fr = front(points)
    rows = [p.csv_row() for p in points]
    on_front = {id(p) for p in fr}
    for p, row in zip(points, rows, strict=True):
        row["on_front"] = id(p) in on_front
    with open_output(out / "target_front.csv", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    choice = TargetChoice(best, ref, len(fr), len(points),
                          "default clocks only: " + "; ".join(skipped) if skipped else None)
    doc = {**choice.to_dict(), "chosen": best.row(), "reference": ref.row(), "front": [p.row() for p in fr],
           "target": dataclasses.asdict(target), "config": dataclasses.asdict(cfg),
           "interruptible": placement.interruptible if placement is not None else None}
    write_text(out / "target.json", json.dumps(doc, indent=1) + "\n")
    if plots:
        plot(points, fr, ref, best, out / "target_front.png")
    return choice


__all__ = [
    "DEFAULT_FRONT_PLANNER",
    "FRONT_CLOCK_METHODS",
    "Candidate",
    "FrontConfig",
    "FrontPoint",
    "TargetChoice",
    "candidates",
    "choose",
    "front",
    "front_clocks",
    "place",
    "plot",
    "reference",
    "run_front",
    "saving",
    "select_plans",
]
