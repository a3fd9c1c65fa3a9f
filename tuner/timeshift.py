"""``tune --objective carbon`` with hourly intensity: each plan priced at its own best start (or hours).

A :class:`TimeShift` is the job the user describes — an hourly intensity series, a start window, a
length (wall hours, or iterations × the plan's simulated iteration time) and whether it may pause.
The objective (:meth:`mindpipe.tuner.objectives.Objective.derive`) asks it, for each evaluated
plan, for that plan's cleanest schedule (:mod:`mindpipe.simulator.timeshift`): the plan draws a
constant facility power (energy per iteration / iteration time; PUE included), so its carbon per
iteration is its energy × the schedule's mean intensity, and plan and start are chosen together.

:func:`shift_report` then states the outcome against the **reference**: the throughput-optimal
plan (the highest simulated throughput among the sweep's plans that fit in memory) run
contiguously from the window's start ("now"). ``carbon_saving_fraction`` is
``1 − (gCO2 per sample, chosen) / (gCO2 per sample, reference)``; with ``--iterations`` and one
global batch both do the same work and it equals ``1 − carbon_gco2 / carbon_gco2_if_now``. With
``--job-hours`` every plan runs that many wall hours (a reservation), so plans do different work
and the per-sample ratio is the fair one.

From a notebook::

    from mindpipe.simulator.carbon import load_carbon_csv
    from mindpipe.simulator.timeshift import parse_window
    from mindpipe.tuner.api import tune
    from mindpipe.tuner.objectives import Objective

    shift = TimeShift(load_carbon_csv("GB_2024_hourly.csv"), parse_window("2024-06-01T00:00Z/2024-06-02T00:00Z"),
                      JobLength(iterations=2000), interruptible=True)
    report = tune("gpt3-175b", "a100-sxm4-80gb:16x8", objective=Objective("carbon", shift=shift),
                  out="sweeps/gb").summary.timeshift
    report.start, report.schedule.run_hours(), report.carbon_saving_fraction
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import InitVar, asdict, dataclass, field
from pathlib import Path
from typing import Any

from mindpipe.simulator.carbon import CarbonSeries, stamp
from mindpipe.simulator.energy import J_PER_KWH
from mindpipe.simulator.timeshift import ShiftedSchedule, Window, schedule
from mindpipe.traces.atomic import write_text
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import limit
from mindpipe.tuner.keys import PYTHON_ARG_NAMES, ArgNames
from mindpipe.tuner.records import ScoredRecord, Status

MAX_JOB_HOURS = 24 * 366  # a year: beyond any hourly series a user has


@dataclass(frozen=True)
class JobLength:
    """The job's length: wall ``hours`` or a number of ``iterations`` (exactly one).

    ``arg_names`` (not kept) says how errors name the values: this class's fields
    (``JobLength.hours``) by default, ``mindpipe tune``'s flags with
    :data:`~mindpipe.tuner.keys.CLI_ARG_NAMES`.

    Raises:
        ContractError: both or neither given, or a value out of range (naming the flag or field).
    """

    hours: float | None = None
    iterations: int | None = None
    arg_names: InitVar[ArgNames] = PYTHON_ARG_NAMES

    def __post_init__(self, arg_names: ArgNames) -> None:
        cli = not arg_names.python
        hours, iterations = ("--job-hours", "--iterations") if cli else ("JobLength.hours", "JobLength.iterations")
        if (self.hours is None) == (self.iterations is None):
            raise ContractError(f"{hours}/{iterations}", None, (
                "give exactly one of --job-hours H and --iterations N" if cli else
                "give exactly one of hours and iterations") + " (the job's length)")
        if self.hours is not None and not (0 < self.hours <= MAX_JOB_HOURS):
            raise ContractError(hours, None, f"{self.hours} must be in (0, {MAX_JOB_HOURS}] hours")
        top = int(limit("train_steps"))
        if self.iterations is not None and not (0 < self.iterations <= top):
            raise ContractError(iterations, None, f"{self.iterations} must be in [1, {top:,}] (train_steps limit)")

    def seconds(self, iteration_time_s: float) -> float:
        """Wall seconds of the job for a plan with this iteration time."""
        if self.hours is not None:
            return self.hours * 3600.0
        return float(self.iterations or 0) * iteration_time_s

    def iterations_of(self, iteration_time_s: float) -> float:
        """Iterations the job runs for a plan with this iteration time."""
        if self.iterations is not None:
            return float(self.iterations)
        return self.seconds(iteration_time_s) / iteration_time_s


@dataclass
class TimeShift:
    """The job to place in time (see the module docstring)."""

    series: CarbonSeries
    window: Window
    job: JobLength
    interruptible: bool = False
    _cache: dict[float, ShiftedSchedule] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        span = (self.window.end - self.window.start).total_seconds()
        # Fail before any simulation: the window must lie in the series, and with a wall length
        # so must the deadline (window end + job); with iterations that needs the plan's speed.
        self.series.check_covers(self.window.start, span + (self.job.hours or 0.0) * 3600.0)

    def schedule_for(self, iteration_time_s: float) -> ShiftedSchedule:
        """The cleanest schedule for a plan with this iteration time (cached per job length).

        Raises:
            ContractError: the job (window end + length) runs past the series.
        """
        job_s = self.job.seconds(iteration_time_s)
        if job_s not in self._cache:
            self._cache[job_s] = schedule(self.series, self.window, job_s, self.interruptible)
        return self._cache[job_s]

    def identity(self) -> dict[str, Any]:
        """What makes two sweeps the same job (for ``--resume``): series hash, window, length, kind."""
        blob = repr((self.series.times, self.series.values)).encode()
        return {"series": hashlib.sha256(blob).hexdigest()[:16], "window": [stamp(self.window.start),
                stamp(self.window.end)], "job_hours": self.job.hours, "iterations": self.job.iterations,
                "interruptible": self.interruptible}


@dataclass(frozen=True)
class PlanRun:
    """A plan's simulated power and speed: what its job's carbon depends on."""

    iteration_time_s: float
    energy_j: float
    global_batch: int

    @property
    def power_w(self) -> float:
        """Facility power while the job runs (PUE included)."""
        return self.energy_j / self.iteration_time_s


@dataclass(frozen=True)
class SegmentSteps:
    """One run segment of a shifted job, with the global step to train until (``mindpipe run --steps``)."""

    start: str
    end: str
    hours: float
    until_step: int
    intensity_g_per_kwh: float


@dataclass(frozen=True)
class ReferenceRun:
    """The job as the reference plan would run it: contiguously from the window's start.

    Attributes:
        run: The reference plan's power and speed.
        job_s: Seconds its job runs.
        samples: Samples it trains.
        intensity_g_per_kwh: Mean intensity over those seconds from the window's start.
        plan_point: The sweep's point, when the reference is one of its plans.
        what: What the reference is (``timeshift.json``); ``label``: the same, short, for the text output.
    """

    run: PlanRun
    job_s: float
    samples: float
    intensity_g_per_kwh: float
    plan_point: dict[str, Any] | None = None
    what: str = "throughput-optimal plan of this sweep, run contiguously from the window start"
    label: str = "the throughput-optimal plan"

    @property
    def energy_kwh(self) -> float:
        """Facility energy of the job."""
        return self.run.power_w * self.job_s / J_PER_KWH

    @property
    def carbon_gco2(self) -> float:
        """Emissions of the job."""
        return self.energy_kwh * self.intensity_g_per_kwh

    def to_dict(self) -> dict[str, Any]:
        """The ``reference`` object of ``timeshift.json`` (``plan_point`` only when known)."""
        out: dict[str, Any] = {"what": self.what, "iteration_time_s": self.run.iteration_time_s,
                               "power_w": self.run.power_w, "job_hours": self.job_s / 3600, "samples": self.samples,
                               "intensity_g_per_kwh": self.intensity_g_per_kwh, "energy_kwh": self.energy_kwh}
        if self.plan_point is not None:
            out["plan_point"] = self.plan_point
        return out


@dataclass(frozen=True)
class ShiftReport:
    """The chosen plan's schedule and carbon against the reference plan started now (:func:`shift_report`).

    Attributes:
        schedule: The chosen plan's cleanest schedule.
        steps: Its segments with the step to train until in each.
        run: The chosen plan's power and speed.
        samples: What it trains over the job.
        reference: The reference run.
    """

    schedule: ShiftedSchedule
    steps: list[SegmentSteps]
    run: PlanRun
    samples: float
    reference: ReferenceRun

    @property
    def start(self) -> str:
        """The chosen start (UTC, ISO-8601)."""
        return stamp(self.schedule.start)

    @property
    def job_hours(self) -> float:
        """Hours the job runs (waiting excluded)."""
        return self.schedule.job_s / 3600

    @property
    def carbon_gco2(self) -> float:
        """Emissions of the chosen schedule."""
        return self.schedule.carbon_gco2(self.run.power_w)

    @property
    def carbon_gco2_if_now(self) -> float:
        """Emissions of the reference plan run from the window's start."""
        return self.reference.carbon_gco2

    @property
    def carbon_gco2_same_plan_if_now(self) -> float:
        """Emissions of the chosen plan run from the window's start."""
        return self.schedule.carbon_if_now_gco2(self.run.power_w)

    @property
    def energy_kwh(self) -> float:
        """Facility energy of the chosen plan's job."""
        return self.run.power_w * self.schedule.job_s / J_PER_KWH

    @property
    def carbon_saving_fraction(self) -> float:
        """``1 −`` (gCO2 per sample, chosen) ÷ (gCO2 per sample, reference); 0 for a clean reference."""
        per_sample_now = self.carbon_gco2_if_now / self.reference.samples
        return 0.0 if per_sample_now <= 0 else 1.0 - self.carbon_gco2 / self.samples / per_sample_now

    def to_dict(self) -> dict[str, Any]:
        """``timeshift.json``, and the summary's keys: ``start``, ``run_hours``, ``job_hours``, ``carbon_gco2``,
        ``carbon_gco2_if_now``, ``carbon_saving_fraction`` and the ``timeshift`` block (the schedule with
        each segment's step, the same plan started now, the reference)."""
        block: dict[str, Any] = {k: v for k, v in self.schedule.to_json().items() if k not in ("start", "run_hours")}
        block.update(segments=[asdict(seg) for seg in self.steps], samples=self.samples, energy_kwh=self.energy_kwh,
                     carbon_gco2_same_plan_if_now=self.carbon_gco2_same_plan_if_now, reference=self.reference.to_dict())
        return {"start": self.start, "run_hours": self.schedule.run_hours(), "job_hours": self.job_hours,
                "carbon_gco2": self.carbon_gco2, "carbon_gco2_if_now": self.carbon_gco2_if_now,
                "carbon_saving_fraction": self.carbon_saving_fraction, "timeshift": block}


def _steps(shift: TimeShift, run: PlanRun, sched: ShiftedSchedule) -> list[SegmentSteps]:
    """Per segment: the global step to train until (``mindpipe run --steps``), for an operator to follow."""
    out, done = [], 0.0
    total = shift.job.iterations_of(run.iteration_time_s)
    for seg in sched.segments:
        done += seg.seconds
        end_step = total if seg is sched.segments[-1] else done / run.iteration_time_s
        out.append(SegmentSteps(stamp(seg.start), stamp(seg.end), seg.seconds / 3600, math.floor(end_step + 1e-9),
                                seg.intensity_g_per_kwh))
    return out


def shift_report(shift: TimeShift, best: PlanRun, reference: PlanRun) -> ShiftReport:
    """The chosen plan's schedule and carbon against the throughput-optimal plan started now."""
    ref_s = shift.job.seconds(reference.iteration_time_s)
    ref = ReferenceRun(reference, ref_s, shift.job.iterations_of(reference.iteration_time_s) * reference.global_batch,
                       shift.series.intensity_over(shift.window.start, ref_s))
    return reprice(shift, best, ref)


def reprice(shift: TimeShift, chosen: PlanRun, reference: ReferenceRun) -> ShiftReport:
    """The report for the plan the operator runs (``chosen``: its speed and power, e.g. with the stage
    clocks ``--clocks`` adds after the search) against an unchanged ``reference``: the schedule, each
    segment's step and the carbon are placed again for that plan's job."""
    sched = shift.schedule_for(chosen.iteration_time_s)
    return ShiftReport(sched, _steps(shift, chosen, sched), chosen,
                       shift.job.iterations_of(chosen.iteration_time_s) * chosen.global_batch, reference)


def write_report(report: ShiftReport, out: Path) -> Path:
    """``out/timeshift.json`` (:meth:`ShiftReport.to_dict`), written safely; its path."""
    path = out / "timeshift.json"
    write_text(path, json.dumps(report.to_dict(), indent=1) + "\n")
    return path


def _run_of(rec: ScoredRecord) -> PlanRun | None:
    m = rec.metrics
    ok = rec.evaluation.status is Status.OK and rec.simulated
    if not ok or not m.iteration_time_s or m.energy_j is None or m.throughput_samples_per_s is None:
        return None
    return PlanRun(m.iteration_time_s, m.energy_j, int(rec.point["global_batch_size"]))


FALLBACK_REFERENCE = ("fastest plan of this sweep whose job the series covers from the window start (the "
                      "throughput-optimal plan's job runs past the hours the series covers), run contiguously from "
                      "the window start")


def report_for(shift: TimeShift, records: Sequence[ScoredRecord], best: ScoredRecord) -> ShiftReport:
    """:func:`shift_report` for a sweep: ``best`` against its fastest plan that fits in memory.

    With ``--iterations`` a plan's job is its own length, so the fastest plan's (at a larger global
    batch, a longer job) may run past the series' end from the window's start while the chosen plan
    fits: the reference is then the fastest plan whose job the series covers, and its ``what`` says so.

    Raises:
        ContractError: the best record was not simulated (no power to price), or no plan's job run
            from the window's start lies in the series.
    """
    chosen = _run_of(best)
    if chosen is None:
        raise ContractError("tune", None, "the best plan has no simulated energy to place in time")
    runs = sorted(((r, run) for r in records if (run := _run_of(r)) is not None),
                  key=lambda rr: (-(rr[0].metrics.throughput_samples_per_s or 0.0), rr[0].index))
    for k, (fastest, reference) in enumerate(runs):
        try:
            report = shift_report(shift, chosen, reference)
        except ContractError:  # its job, from the window's start, runs past the series
            continue
        ref = dataclasses.replace(report.reference, plan_point=dict(fastest.point))
        if k:
            ref = dataclasses.replace(ref, what=FALLBACK_REFERENCE, label="the fastest plan the series covers")
        return dataclasses.replace(report, reference=ref)
    raise ContractError("tune", None, "no plan's job, run from the window start, lies within the carbon series")


__all__ = ["JobLength", "PlanRun", "ReferenceRun", "SegmentSteps", "ShiftReport", "TimeShift", "report_for", "reprice",
           "shift_report", "write_report"]
