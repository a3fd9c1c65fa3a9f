"""What ``mindpipe tune`` reports about a sweep: one typed record, written once as ``summary.json``.

:class:`TuneSummary` is assembled by :func:`mindpipe.tuner.api.tune` from the sweep
(:func:`build_summary`) and the steps after it — a time-shifted job's schedule
(:mod:`mindpipe.tuner.timeshift`), the carbon-to-target front (:mod:`mindpipe.tuner.target_front`),
the best plan's stage clocks (:mod:`mindpipe.tuner.clock_step`) — and written once, after the last
of them, so that ``summary.json`` is what ``--json`` prints. :meth:`TuneSummary.to_dict` is that
JSON object; its keys are the ones the file has always had (README, "tune --json").
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mindpipe.traces.atomic import write_text
from mindpipe.traces.config import Plan
from mindpipe.traces.schema import to_dict
from mindpipe.traces.supernet import Supernet
from mindpipe.tuner.frequency import ClockPlan
from mindpipe.tuner.objectives import CriticalBatch, Objective
from mindpipe.tuner.space import SearchSpace
from mindpipe.tuner.subnet_space import equivalent_to_sequential
from mindpipe.tuner.sweep import SweepResult
from mindpipe.tuner.target_front import TargetChoice
from mindpipe.tuner.timeshift import ShiftReport

METRIC_COLUMNS = (
    "iteration_time_s", "throughput_samples_per_s", "throughput_tokens_per_s", "goodput_samples_per_s",
    "statistical_efficiency", "tflops_per_gpu", "mfu", "bubble_fraction", "exposed_dp_comm_s", "peak_memory_gib",
    "energy_j", "energy_per_sample_j", "carbon_gco2", "carbon_per_sample_g", "subnets_per_hour",
    "iterations_to_target", "compute_hours_to_target", "wait_hours_to_target", "energy_to_target_kwh",
    "carbon_to_target_g",
)


@dataclass(frozen=True)
class WhatIfUse:
    """The what-if knobs a sweep searched and pinned, and those its best plan uses (values the
    executor does not carry out)."""

    searched: list[str]
    pinned: dict[str, Any]
    best_plan_uses: list[str]


@dataclass(frozen=True)
class SupernetSummary:
    """What a supernet sweep says about its plans (NASPipe): subnets per hour, and whether the best
    plan trains exactly as sequential training."""

    name: str
    samples_per_subnet: int | None
    subnet_schedules_searched: list[str]
    best_plan_equivalent_to_sequential: bool | None
    value_unit: str = "subnets/hour"
    goodput: str = "for supernets, goodput counts subnets trained per hour"
    note: str = "sync and async are not equivalent to sequential training (searched only when pinned)"

    def to_dict(self) -> dict[str, Any]:
        """The ``supernet`` object of the summary."""
        return {"name": self.name, "value_unit": self.value_unit, "goodput": self.goodput,
                "samples_per_subnet": self.samples_per_subnet,
                "subnet_schedules_searched": self.subnet_schedules_searched,
                "best_plan_equivalent_to_sequential": self.best_plan_equivalent_to_sequential, "note": self.note}


@dataclass
class TuneSummary:
    """A sweep's outcome as ``summary.json`` and ``--json`` give it.

    Attributes:
        objective: The objective as :meth:`Objective.describe` names it.
        best_plan: The best plan as written to ``best_plan.json`` (with ``made_for``; with the
            front's or the clock step's clocks once they ran); None when nothing was feasible.
        best_value, best_metrics: Its objective value and metrics (:data:`METRIC_COLUMNS`).
        what_if: The what-if knobs searched, pinned and used.
        flash_attention_searched: The attention kernels the space covered.
        evaluations, evaluated_points, reused: Simulations run, points considered, points taken
            from a previous run (``--resume``).
        infeasible_by_reason: Infeasible points per reason (``rules``: combinations the plan rules
            filtered out before any simulation), split in the two below, which add up to it.
        space_size, pareto_points: Valid points; plans on the throughput-vs-carbon front.
        out: The output directory.
        supernet: A supernet sweep's note (None for GPT models).
        search: ``--search``: the values each key took in the space.
        timeshift: ``--carbon-csv`` with ``--objective carbon``: the chosen start and its carbon
            (:func:`mindpipe.tuner.timeshift.report_for`; its headline keys and ``timeshift`` block).
        target: ``--objective carbon_to_target``: the front's choice
            (:class:`mindpipe.tuner.target_front.TargetChoice`).
        critical_batch: The critical batch goodput used and where it came from.
        clocks: ``--clocks``: the clock plan of the best plan (:mod:`mindpipe.tuner.clock_step`).
        written: The files :func:`mindpipe.tuner.output.write_outputs` wrote to ``out`` (names as the
            text output lists them; not in the JSON).
        infeasible_simulated: Of ``infeasible_by_reason``, the simulations' per reason
            (:attr:`mindpipe.tuner.sweep.SweepResult.simulated_infeasible`): plans simulated (or failed
            trying) that did not fit at their simulated peak, broke a constraint or had no value.
        refused_before_simulation: The rest, per reason: ``rules`` (combinations the plan rules
            filtered: never plans), ``out_of_memory`` (plans the memory estimate refused), ``invalid``
            (a plan rule the evaluation found) — none of them simulated, none cost budget.
    """

    objective: str
    best_plan: Plan | None
    best_value: float | None
    best_metrics: dict[str, float | None] | None
    what_if: WhatIfUse
    flash_attention_searched: list[bool]
    evaluations: int
    evaluated_points: int
    reused: int
    infeasible_by_reason: dict[str, int]
    space_size: int
    pareto_points: int
    out: str
    supernet: SupernetSummary | None = None
    search: dict[str, list[Any]] | None = None
    timeshift: ShiftReport | None = None
    target: TargetChoice | None = None
    critical_batch: CriticalBatch | None = None
    clocks: ClockPlan | None = None
    written: list[str] = field(default_factory=list)
    infeasible_simulated: dict[str, int] = field(default_factory=dict)
    refused_before_simulation: dict[str, int] = field(default_factory=dict)

    @property
    def infeasible(self) -> int:
        """Infeasible points of every reason (the plan rules' filtered combinations included)."""
        return sum(self.infeasible_by_reason.values())

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``summary.json`` and ``--json``; optional parts only where they exist."""
        out: dict[str, Any] = {
            "objective": self.objective, "best_plan": to_dict(self.best_plan) if self.best_plan is not None else None,
            "best_value": self.best_value, "best_metrics": self.best_metrics, "what_if": asdict(self.what_if),
            "flash_attention_searched": self.flash_attention_searched, "evaluations": self.evaluations,
            "evaluated_points": self.evaluated_points, "reused": self.reused, "infeasible": self.infeasible,
            "infeasible_by_reason": self.infeasible_by_reason, "infeasible_simulated": self.infeasible_simulated,
            "refused_before_simulation": self.refused_before_simulation, "space_size": self.space_size,
            "pareto_points": self.pareto_points, "out": self.out,
        }
        if self.supernet is not None:
            out["supernet"] = self.supernet.to_dict()
        if self.search is not None:  # absent without --search, so other summaries are unchanged
            out["search"] = self.search
        if self.timeshift is not None:
            out.update(self.timeshift.to_dict())
        if self.target is not None:
            out.update(self.target.to_dict())
        if self.critical_batch is not None and self.critical_batch.value is not None:
            out["critical_batch"] = asdict(self.critical_batch)
        if self.clocks is not None:
            clocks = self.clocks.to_dict()
            clocks.pop("frontier")  # in clocks.json
            out["clocks"] = {**clocks, "frontier_points": len(self.clocks.frontier)}
        return out

    def write(self) -> Path:
        """Write ``summary.json`` into :attr:`out` (atomically); its path."""
        path = Path(self.out) / "summary.json"
        write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")
        return path


def _finite(x: float | None) -> float | None:
    """JSON has no inf/NaN: they become null."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return x


def _supernet(space: SearchSpace, plan: Plan | None) -> SupernetSummary | None:
    if not isinstance(space.model, Supernet):
        return None
    equivalent = equivalent_to_sequential({"subnet_schedule": plan.subnet_schedule or "csp"}) if plan else None
    return SupernetSummary(space.model.label, plan.global_batch_size if plan is not None else None,
                           space.values("subnet_schedule"), equivalent)


def build_summary(result: SweepResult, objective: Objective, space: SearchSpace, out: Path, pareto_count: int,
                  plan: Plan | None) -> TuneSummary:
    """The summary of a sweep (``plan``: the best plan as written to ``best_plan.json``)."""
    best = result.best
    infeasible: dict[str, int] = {v.value: n for v, n in result.infeasible.items()}
    refused: dict[str, int] = {v.value: n for v, n in result.refused.items()}
    if space.rejected_total:
        infeasible["rules"] = refused["rules"] = space.rejected_total
    return TuneSummary(
        objective=objective.describe(), best_plan=plan, best_value=best.value if best else None,
        best_metrics={k: _finite(best.metrics.get(k)) for k in METRIC_COLUMNS} if best else None,
        what_if=WhatIfUse([k for k in space.what_if if k not in space.fixes],
                          {k: space.fixes[k] for k in space.what_if if k in space.fixes},
                          list(plan.made_for.what_if) if plan is not None and plan.made_for else []),
        # Attention kernels the search covered: explicit ones only unless --fix (or a trace) says otherwise.
        flash_attention_searched=sorted({bool(p.get("flash_attention", False)) for p in space.points}),
        evaluations=result.simulations, evaluated_points=len(result.records), reused=result.reused,
        infeasible_by_reason=infeasible, space_size=space.size, pareto_points=pareto_count, out=str(out),
        infeasible_simulated={v.value: n for v, n in result.simulated_infeasible.items()},
        refused_before_simulation=refused,
        supernet=_supernet(space, plan),
        search={k: sorted({p.get(k) for p in space.points}) for k in space.search} if space.search else None,
    )


__all__ = ["METRIC_COLUMNS", "SupernetSummary", "TuneSummary", "WhatIfUse", "build_summary"]
