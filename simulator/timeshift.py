"""Carbon-aware time-shifting: when to run a job inside a start window, given hourly grid intensity.

A job of ``job_s`` seconds draws a constant facility power (a plan's simulated energy per
iteration / iteration time, PUE included), so its emissions are ``power × Σ_segments
seconds × CI`` and the cleanest schedule is the one with the least time-weighted intensity. Two
kinds of job (BACKGROUND.md §7, "time-shifting bounds"; Wiesner et al., *Let's Wait Awhile*,
Middleware'21):

* **non-interruptible**: one contiguous run that may start at any instant of the window
  ``[start, end]`` (both ends included: "a 4-hour job that may start within 24 h" may start
  exactly 24 h late). The cost of a start ``t`` is linear between the instants where ``t`` or
  ``t + job_s`` crosses an hour of the series, so those breakpoints (and the window's ends) are
  the only candidates; the cheapest wins, ties going to the earliest.
* **interruptible** (the job checkpoints, pauses and resumes): it runs in the cleanest hours of
  the series between the window's start and the **deadline** ``end + job length`` — the latest
  finish of a job started at the window's last instant, so both kinds of job finish by the same
  time. The span is cut at the series' own points (and at its two ends, so a window starting at
  00:30 has a first slot 00:30–01:00), which makes every slot one intensity; slots are filled
  cleanest first and a fractional remainder runs at the start of the next-cleanest slot — exact
  (a fractional knapsack), and never dirtier than the best contiguous run, which is one of its
  choices.

The reference ("now") is the same job run contiguously from the window's start. Every intensity
is integrated by :meth:`mindpipe.simulator.carbon.CarbonSeries.intensity_over` (partial hours
weighted by time), the one owner of that rule. Pure Python; no torch.
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
import math
from dataclasses import dataclass, field

from mindpipe.simulator.carbon import HOUR, CarbonSeries, parse_time, stamp, utc
from mindpipe.simulator.energy import J_PER_KWH
from mindpipe.traces.errors import ContractError

MAX_WINDOW_HOURS = 24 * 366 * 2  # two years of hourly slots: far beyond any published series


@dataclass(frozen=True)
class Window:
    """The instants a job may start at: ``[start, end]`` (UTC, both included).

    Attributes:
        start: Earliest start ("now").
        end: Latest start; not before ``start``.
        source: What errors name (the flag or file).
    """

    start: dt.datetime
    end: dt.datetime
    source: str = "--window"

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", utc(self.start))
        object.__setattr__(self, "end", utc(self.end))
        if self.end < self.start:
            raise ContractError(self.source, "END", f"END {stamp(self.end)} is before START {stamp(self.start)}")
        if (self.end - self.start).total_seconds() > MAX_WINDOW_HOURS * 3600:
            raise ContractError(self.source, "END", f"a window longer than {MAX_WINDOW_HOURS} hours is refused")

    @property
    def hours(self) -> float:
        """Length of the window in hours."""
        return (self.end - self.start).total_seconds() / 3600


def parse_window(text: str, source: str = "--window") -> Window:
    """An ISO-8601 interval ``START/END`` (e.g. ``2024-06-01T00:00Z/2024-06-02T00:00Z``).

    Raises:
        ContractError: not two ISO date-times separated by ``/``, or END before START.
    """
    parts = text.split("/")
    if len(parts) != 2 or not all(p.strip() for p in parts):
        raise ContractError(source, None, f"{text[:60]!r} is not START/END (ISO-8601 interval, e.g. "
                                          "2024-06-01T00:00Z/2024-06-02T00:00Z)")
    return Window(parse_time(parts[0], source, "START"), parse_time(parts[1], source, "END"), source)


@dataclass(frozen=True)
class Segment:
    """One uninterrupted run: ``seconds`` from ``start`` at mean intensity ``intensity_g_per_kwh``."""

    start: dt.datetime
    seconds: float
    intensity_g_per_kwh: float

    @property
    def end(self) -> dt.datetime:
        """When the run pauses (or the job ends)."""
        return self.start + dt.timedelta(seconds=self.seconds)


@dataclass(frozen=True)
class ShiftedSchedule:
    """The chosen schedule of a job and its reference, started at the window's start.

    Attributes:
        segments: The runs, in time order (one unless interruptible).
        job_s: Length of the job (the segments' seconds add up to it).
        interruptible: Whether the job may pause between segments.
        intensity_g_per_kwh: Time-weighted mean intensity of the chosen schedule.
        intensity_if_now_g_per_kwh: Mean intensity of the job run contiguously from the window's start.
    """

    segments: tuple[Segment, ...]
    job_s: float
    interruptible: bool
    intensity_g_per_kwh: float
    intensity_if_now_g_per_kwh: float
    window: Window = field(compare=False)

    @property
    def start(self) -> dt.datetime:
        """When the job (first) starts."""
        return self.segments[0].start

    @property
    def finish(self) -> dt.datetime:
        """When the job's last segment ends."""
        return self.segments[-1].end

    @property
    def wait_s(self) -> float:
        """Seconds from the window's start to the job's start."""
        return (self.start - self.window.start).total_seconds()

    @property
    def saving_fraction(self) -> float:
        """1 − intensity / intensity if run now (0 when both are 0)."""
        now = self.intensity_if_now_g_per_kwh
        return 0.0 if now <= 0 else 1.0 - self.intensity_g_per_kwh / now

    def run_hours(self) -> list[str]:
        """Every clock hour (UTC, ``...T18:00:00Z``) the job runs in, wholly or in part, in time order.

        These are the hours the intensity series is indexed by (Electricity Maps stamps each value
        at its hour's start), so a run from 18:30 to 20:15 lists 18:00, 19:00 and 20:00: the three
        rows of the series it is priced on, not 18:30 and 19:30.
        """
        out: list[str] = []
        for seg in self.segments:
            t = seg.start.replace(minute=0, second=0, microsecond=0)
            while t < seg.end:
                if not out or out[-1] != stamp(t):  # two segments in one hour list it once
                    out.append(stamp(t))
                t += HOUR
        return out

    def carbon_gco2(self, power_w: float) -> float:
        """Emissions of the job at a constant facility power ``power_w`` (W)."""
        return power_w * self.job_s / J_PER_KWH * self.intensity_g_per_kwh

    def carbon_if_now_gco2(self, power_w: float) -> float:
        """Emissions of the same job run contiguously from the window's start."""
        return power_w * self.job_s / J_PER_KWH * self.intensity_if_now_g_per_kwh

    def to_json(self) -> dict[str, object]:
        """Start, run hours, segments (start, end, hours, g/kWh) and intensities, for a side file."""
        return {
            "interruptible": self.interruptible,
            "window": {"start": stamp(self.window.start), "end": stamp(self.window.end)},
            "start": stamp(self.start),
            "finish": stamp(self.finish),
            "job_hours": self.job_s / 3600,
            "wait_hours": self.wait_s / 3600,
            "run_hours": self.run_hours(),
            "segments": [{"start": stamp(s.start), "end": stamp(s.end), "hours": s.seconds / 3600,
                          "intensity_g_per_kwh": s.intensity_g_per_kwh} for s in self.segments],
            "intensity_g_per_kwh": self.intensity_g_per_kwh,
            "intensity_if_now_g_per_kwh": self.intensity_if_now_g_per_kwh,
            "saving_fraction": self.saving_fraction,
        }


def _check_job(series: CarbonSeries, window: Window, job_s: float) -> None:
    if not (math.isfinite(job_s) and job_s > 0):
        raise ContractError(window.source, "job length", f"the job's length must be > 0 seconds, got {job_s}")
    # The horizon every schedule lives in: from the window's start to the deadline (end + job).
    series.check_covers(window.start, (window.end - window.start).total_seconds() + job_s)


def _candidates(series: CarbonSeries, window: Window, job: dt.timedelta) -> list[dt.datetime]:
    """Starts where the cost can change slope: window ends, hour marks at the start or the finish."""
    lo = bisect.bisect_left(series.times, window.start)
    hi = bisect.bisect_right(series.times, window.end + job)
    found = {window.start, window.end}
    for mark in series.times[lo:hi]:
        for t in (mark, mark - job):
            if window.start <= t <= window.end:
                found.add(t)
    return sorted(found)


def best_start(series: CarbonSeries, window: Window, job_s: float) -> ShiftedSchedule:
    """The contiguous run of ``job_s`` seconds, starting in ``window``, with the least intensity.

    Raises:
        ContractError: a non-positive length, or a series that does not cover the window plus the job.
    """
    _check_job(series, window, job_s)
    job = dt.timedelta(seconds=job_s)
    best_t, best_ci = window.start, math.inf
    for t in _candidates(series, window, job):
        ci = series.intensity_over(t, job_s)
        if ci < best_ci:  # candidates are in time order: ties keep the earliest start
            best_t, best_ci = t, ci
    now = series.intensity_over(window.start, job_s)
    return ShiftedSchedule((Segment(best_t, job_s, best_ci),), job_s, False, best_ci, now, window)


def cleanest_hours(series: CarbonSeries, window: Window, job_s: float) -> ShiftedSchedule:
    """The cleanest slots (one intensity each) from the window's start to its deadline, for an interruptible job.

    Raises:
        ContractError: a non-positive length, or a series that does not cover the window plus the job.
    """
    _check_job(series, window, job_s)
    deadline = window.end + dt.timedelta(seconds=job_s)
    slots: list[tuple[float, dt.datetime, float]] = []  # (g/kWh, start, capacity s)
    for t, until in _constant_pieces(series, window.start, deadline):
        cap = (until - t).total_seconds()
        slots.append((series.intensity_over(t, cap), t, cap))
    chosen: list[tuple[dt.datetime, float]] = []
    left = job_s
    for _ci, when, cap in sorted(slots, key=lambda s: (s[0], s[1])):
        if left <= 0:
            break
        use = min(cap, left)
        chosen.append((when, use))
        left -= use
    segments = _merge(series, sorted(chosen))
    mean = sum(s.seconds * s.intensity_g_per_kwh for s in segments) / job_s
    now = series.intensity_over(window.start, job_s)
    return ShiftedSchedule(tuple(segments), job_s, True, mean, now, window)


def _constant_pieces(series: CarbonSeries, start: dt.datetime,
                     finish: dt.datetime) -> list[tuple[dt.datetime, dt.datetime]]:
    """``[start, finish)`` cut at the series' points: spans of one intensity each (the series covers it)."""
    lo = bisect.bisect_right(series.times, start)
    hi = bisect.bisect_left(series.times, finish)
    marks = [start, *series.times[lo:hi], finish]
    return [(a, b) for a, b in itertools.pairwise(marks) if a < b]


def _merge(series: CarbonSeries, runs: list[tuple[dt.datetime, float]]) -> list[Segment]:
    """Adjacent slots joined into uninterrupted segments, each priced over its own span."""
    merged: list[tuple[dt.datetime, float]] = []
    for when, secs in runs:
        if merged and merged[-1][0] + dt.timedelta(seconds=merged[-1][1]) == when:
            merged[-1] = (merged[-1][0], merged[-1][1] + secs)
        else:
            merged.append((when, secs))
    return [Segment(w, s, series.intensity_over(w, s)) for w, s in merged]


def schedule(series: CarbonSeries, window: Window, job_s: float, interruptible: bool) -> ShiftedSchedule:
    """:func:`cleanest_hours` for an interruptible job, else :func:`best_start`."""
    return cleanest_hours(series, window, job_s) if interruptible else best_start(series, window, job_s)


__all__ = ["J_PER_KWH", "Segment", "ShiftedSchedule", "Window", "best_start", "cleanest_hours", "parse_window",
           "schedule"]
