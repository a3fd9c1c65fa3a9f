"""The demo's report: what the closed loop (:mod:`mindpipe.loop`) decided and how well.

Headline figures, each from this run's measurements:

* **speedup** of the tuned plan over the default — medians of their rounds run side by side in the
  last phase — and whether the two plans' round ranges (min–max) overlap (if they do, the machine's
  drift is as large as the difference and the run cannot tell the plans apart);
* **regret** of the tuner: its pick's measured time over the fastest plan's, minus one (0 when its
  pick is the fastest), among the plans of the last phase (the default, the pick, the fastest plan
  of the calibration phase and the held-out plans) from their side-by-side rounds;
* **fidelity** of the simulator on the plans held out of the calibration, before and after it.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path

from mindpipe.loop import LoopConfig, LoopResult, Measured
from mindpipe.simulator.api import SimulationOptions, simulate
from mindpipe.simulator.calibrate.fidelity import (
    FidelityRow,
    fidelity,
    format_calibration,
    plan_label,
    scatter_png,
    summary,
    table_markdown,
)
from mindpipe.simulator.calibrate.memory_fidelity import MemoryRow, memory_rows, memory_table_markdown
from mindpipe.simulator.calibrate.runs import MeasuredRun, measured_events
from mindpipe.simulator.timeline import write_gantts
from mindpipe.traces.calibration import Calibration
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.schema import to_dict
from mindpipe.traces.trace import Trace
from mindpipe.traces.units import plural


@dataclass
class LoopFacts:
    """What the loop did, for the report."""

    cfg: LoopConfig
    model: Model
    trace: Trace
    trace_file: str
    simulated: int
    default: Plan
    tuned1: Plan
    tuned2: Plan
    fit_plans: list[Plan]
    held_plans: list[Plan]
    side_by_side: list[Plan]
    calibration: Calibration
    warnings: list[str]


def verdict(speedup: float) -> str:
    """How a speedup reads: "1.2× faster than", "0.9× as fast as"."""
    return "faster than" if speedup >= 1 else "as fast as"


def _gantt(run: MeasuredRun, cal: Calibration, path: Path) -> None:
    sim = simulate(run.model, run.cluster, run.plan, SimulationOptions(calibration=cal, timeline=True))
    events = measured_events(run)
    span = max((e.end_s for e in events), default=0.0)
    optimizer = any(e.category == "optimizer" for e in events)  # runs recorded before it was kept have none
    drawn = "forward/backward, waits and the optimizer" if optimizer else "forward/backward and waits"
    missing = "host time" if optimizer else "optimizer, host time"
    # Two lines: on one, the title outgrew the 12-inch panel and was cut at both ends.
    write_gantts([(events, f"measured: {plan_label(run.plan)}, one step (dp 0, tp 0): {span:.2f} s of {drawn}\n"
                           f"of {run.iteration_s:.2f} s per iteration ({missing} not recorded per action)"),
                  (sim.timeline or [], f"simulated, calibrated: iteration {sim.iteration_time_s:.2f} s")], path)


def _fmt(times: list[float]) -> str:
    return ", ".join(f"{t:.3f}" for t in times)


def _memory(runs: Measured, keys: list[str]) -> dict[str, list[MemoryRow]]:
    """Per plan (its last run), the simulator's peak memory per rank against the measured one."""
    out = {}
    for k in keys:
        last = runs.runs[k][-1]
        rows = memory_rows(last.measurement, last.model, last.cluster)
        if rows:
            out[k] = rows
    return out


@dataclass
class Headline:
    """The report's headline figures, from the measured rounds only.

    Attributes:
        default_rounds, tuned_rounds: The last phase's rounds of the default and the tuned plan (s).
        default_s, tuned_s: Their medians; ``speedup`` is ``default_s / tuned_s``.
        overlap: Whether the two plans' round ranges (min–max) overlap.
        medians: Every plan's median over all its rounds, by plan key.
        side_medians: The last phase's plans' medians over their last phase's rounds, by plan key.
        fastest: The key of the fastest of those; ``regret`` is the tuned plan's side-by-side median
            over the fastest one's, minus one.
    """

    default_rounds: list[float]
    tuned_rounds: list[float]
    default_s: float
    tuned_s: float
    speedup: float
    overlap: bool
    medians: dict[str, float]
    side_medians: dict[str, float]
    fastest: str
    regret: float


def headline(f: LoopFacts, runs: Measured) -> Headline:
    """Speedup of the tuned plan over the default, side by side, and the tuner's regret."""
    rounds = f.cfg.rounds
    d_side, t_side = runs.times(f.default)[-rounds:], runs.times(f.tuned2)[-rounds:]
    d_s, t_s = statistics.median(d_side), statistics.median(t_side)
    medians = {k: statistics.median(r.iteration_s for r in rs) for k, rs in runs.runs.items()}
    side = {Measured.key(p): statistics.median(runs.times(p)[-rounds:]) for p in f.side_by_side}
    fastest = min(side, key=side.__getitem__)
    return Headline(
        default_rounds=d_side, tuned_rounds=t_side, default_s=d_s, tuned_s=t_s, speedup=d_s / t_s,
        overlap=min(d_side) <= max(t_side) and min(t_side) <= max(d_side), medians=medians, side_medians=side,
        fastest=fastest, regret=t_s / side[fastest] - 1.0,
    )


def _figures(f: LoopFacts, runs: Measured, figs: Path, fit_rows: list[FidelityRow], held_rows: list[FidelityRow]) -> None:
    """The calibration scatter, the measured-vs-simulated Gantt charts and the tuner's plots."""
    scatter_png(held_rows, figs / "calibration_scatter.png", fitted=fit_rows,
                title=f"{f.model.label} on {f.cfg.ranks} CPU ranks: predicted vs measured")
    _gantt(runs.combined(f.tuned2), f.calibration, figs / "gantt_tuned.png")
    _gantt(runs.combined(f.default), f.calibration, figs / "gantt_default.png")
    for name in ("pareto.png", "convergence.png"):
        src = Path(f.cfg.out) / "tune-calibrated" / name
        if src.exists():
            shutil.copyfile(src, figs / f"tune_calibrated_{name}")


def _plan_table(f: LoopFacts, runs: Measured, h: Headline, pred: dict[str, FidelityRow]) -> list[str]:
    """Every plan measured, fastest first: its role, rounds, median and the two predictions."""

    def role(k: str) -> str:
        roles = [name for name, plan in (("default", f.default), ("tuned, uncalibrated", f.tuned1),
                                          ("tuned, calibrated", f.tuned2)) if Measured.key(plan) == k]
        fitted = any(Measured.key(p) == k for p in f.fit_plans)
        if not roles:
            return "probe (fitted on)" if fitted else "held out"
        return ", ".join(roles) + (" (fitted on)" if fitted else "")

    table = ["| role | plan | rounds, s | median of all rounds, s | predicted uncalibrated s | predicted calibrated s |",
             "|---|---|---|---:|---:|---:|"]
    for k in sorted(h.medians, key=h.medians.__getitem__):
        row = pred.get(k)
        table.append(f"| {role(k)} | {k} | {_fmt(runs.times(runs.plans[k]))} | {h.medians[k]:.3f} | "
                     f"{row.uncalibrated_s:.3f} | {row.calibrated_s:.3f} |" if row and row.calibrated_s is not None
                     else f"| {role(k)} | {k} | {_fmt(runs.times(runs.plans[k]))} | {h.medians[k]:.3f} | | |")
    return table


def write_report(f: LoopFacts, runs: Measured) -> LoopResult:
    """Write ``report.md``, ``report.json`` and the figures under ``f.cfg.out``; the headline figures."""
    out = Path(f.cfg.out)
    figs = out / "figures"
    figs.mkdir(parents=True, exist_ok=True)
    h = headline(f, runs)
    fit_rows = fidelity([runs.combined(p, first=f.cfg.rounds) for p in f.fit_plans], f.calibration)  # the rounds fitted
    held_rows = fidelity([runs.combined(p) for p in f.held_plans], f.calibration)
    _figures(f, runs, figs, fit_rows, held_rows)
    s = summary(held_rows)
    memory = _memory(runs, sorted(h.medians, key=h.medians.__getitem__))
    table = _plan_table(f, runs, h, {row.plan: row for row in fit_rows + held_rows})
    report = out / "report.md"
    spread = "; ".join(f"{Measured.key(p)} {_fmt(runs.times(p))} s" for p in f.held_plans)
    report.write_text("\n".join(_markdown(f, h, table, fit_rows, held_rows, memory, spread)), encoding="utf-8")
    (out / "report.json").write_text(json.dumps({
        "default_plan": to_dict(f.default), "tuned_plan_uncalibrated": to_dict(f.tuned1), "tuned_plan": to_dict(f.tuned2),
        "rounds_side_by_side": {"default_s": h.default_rounds, "tuned_s": h.tuned_rounds},
        "measured_default_s": h.default_s, "measured_tuned_s": h.tuned_s, "speedup": h.speedup,
        "round_ranges_overlap": h.overlap, "regret": h.regret, "fastest_plan": h.fastest,
        "median_s_by_plan": h.medians, "side_by_side_median_s_by_plan": h.side_medians, "holdout": s.to_dict(),
        "holdout_rows": [vars(r) for r in held_rows], "fitted_rows": [vars(r) for r in fit_rows],
        "memory_by_plan": {k: [{**vars(r), "rel_error": r.rel_error} for r in rows] for k, rows in memory.items()},
    }, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return LoopResult(report, h.default_s, h.tuned_s, h.speedup, h.overlap, h.regret, s, f.calibration)


def _markdown(f: LoopFacts, h: Headline, table: list[str], fit_rows: list[FidelityRow], held_rows: list[FidelityRow],
              memory: dict[str, list[MemoryRow]], spread: str = "") -> list[str]:
    """The lines of ``report.md``, section by section (each section ends with a blank line)."""
    return [
        *_md_title(f),
        *_md_result(f, h, table),
        *_md_what_happened(f, h.medians),
        *_md_fidelity(fit_rows, held_rows, spread),
        *_md_memory(memory),
        *_md_figures(),
    ]


def _md_title(f: LoopFacts) -> list[str]:
    """The title and how this report was made (when, where, with how many rounds and steps)."""
    cfg = f.cfg
    return [
        f"# MindPipe closed loop: {f.model.label} on {cfg.ranks} CPU ranks",
        "",
        f"Written by `mindpipe demo` on {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')} "
        f"({platform.processor() or platform.machine()}, Python {platform.python_version()}). Every figure below "
        f"was measured or simulated in this run. Global batch {cfg.global_batch}; each phase ran its plans in {cfg.rounds} "
        f"interleaved rounds of {cfg.run.steps} steps ({cfg.run.warmup_steps} warm-up, the last one profiled), so a "
        f"plan run in both phases (calibration, then side by side) has {2 * cfg.rounds} rounds; a round's time is the "
        "median of its measured steps.",
        "",
    ]


def _md_result(f: LoopFacts, h: Headline, table: list[str]) -> list[str]:
    """``## Result``: the speedup, the side-by-side rounds, the regret and the table of every plan."""
    apart = ("The two plans' rounds do not overlap: the difference is larger than this machine's drift."
             if not h.overlap else "The two plans' rounds overlap: the difference is within this machine's drift, "
             "so this run cannot tell them apart.")
    # the default, the tuner's pick, the fastest plan of the calibration runs and the held-out plans: some may coincide
    among = (f"among the {len(h.side_medians)} distinct plans run side by side in the last phase "
             f"({'; '.join(f'{k} {v:.3f} s' for k, v in sorted(h.side_medians.items(), key=lambda kv: kv[1]))})")
    drift = " (by median: the pick's and the default's rounds overlap)" if h.overlap else ""
    regret_line = (f"{among}, the tuner's pick is the fastest (regret 0 %){drift}." if h.regret <= 0 else
                   f"{among}, the fastest is {h.fastest} ({h.side_medians[h.fastest]:.3f} s); the tuner's pick is "
                   f"{100 * h.regret:.1f} % slower (its regret).")
    medians_note = ("The table's medians are over all of a plan's rounds, both phases for the plans run in both; the "
                    "headline and the regret compare the last phase's side-by-side rounds only.")
    return [
        "## Result",
        "",
        f"**The tuned plan ({plan_label(f.tuned2)}) trains {h.speedup:.2f}× {verdict(h.speedup)} the default plan "
        f"({plan_label(f.default)}: torchtitan's defaults, a pipeline over every rank, even split, micro-batch "
        f"{f.cfg.micro_batch}): {h.tuned_s:.3f} s vs {h.default_s:.3f} s per iteration, run side by side.**",
        "",
        f"Rounds side by side: default {_fmt(h.default_rounds)} s; tuned {_fmt(h.tuned_rounds)} s. {apart}",
        "",
        f"**Regret:** {regret_line}",
        "",
        *table,
        "",
        medians_note,
        "",
    ]


def _md_what_happened(f: LoopFacts, medians: dict[str, float]) -> list[str]:
    """``## What happened``: the loop's five steps (profile, tune, run, calibrate, re-tune)."""
    cfg = f.cfg
    return [
        "## What happened",
        "",
        f"1. **Profile**: per-layer CPU times of {f.model.label} at micro-batch {cfg.profile_micro_batch} "
        f"(`{f.trace_file}`, {len(f.trace.layers)} layers).",
        f"2. **Tune, uncalibrated**: {f.simulated} plans simulated on the profiled trace with dedicated devices; "
        f"best: {plan_label(f.tuned1)}"
        + (f", measured {medians[Measured.key(f.tuned1)]:.3f} s." if Measured.key(f.tuned1) in medians else
           " (not run: the uncalibrated simulator knows nothing of this CPU's host costs)."),
        f"3. **Run**: the default plan and {len(f.fit_plans) - 1} probes, {cfg.rounds} rounds each (`measured/`).",
        "4. **Calibrate** on those runs (`calibration.json`):",
        "",
        "```",
        format_calibration(f.calibration),
        "```",
        *(f"   warning: {w}" for w in f.warnings),
        "",
        f"5. **Re-tune with the calibration**: best {plan_label(f.tuned2)}; run beside the default, the fastest "
        f"plan of step 3 and {plural(len(f.held_plans), 'plan')} held out of the fit, {cfg.rounds} rounds each "
        f"({plural(len(f.side_by_side), 'distinct plan')}: some of these may be one plan).",
        "",
    ]


def _md_fidelity(fit_rows: list[FidelityRow], held_rows: list[FidelityRow], spread: str = "") -> list[str]:
    """The simulator's fidelity: held-out plans (with the scatter and their rounds' spread, which
    bounds what an error over so few runs can say), then the plans fitted on."""
    return [
        "## Fidelity on plans the calibration did not see",
        "",
        table_markdown(held_rows),
        "",
        *([f"Each plan's measured time is the median of its rounds (the run named is its first); the held-out "
           f"rounds: {spread}. On this shared machine a round can drift by tens of percent, so an error over "
           f"{plural(len(held_rows), 'plan')} is within that spread.", ""] if spread else []),
        "![calibration scatter](figures/calibration_scatter.png)",
        "",
        "Plans the calibration was fitted on (in-sample):",
        "",
        table_markdown(fit_rows),
        "",
    ]


def _md_memory(memory: dict[str, list[MemoryRow]]) -> list[str]:
    """Predicted against measured peak memory per pipeline rank, or why there is none."""
    return [
        "## Memory per pipeline rank: predicted vs measured",
        "",
        "The simulator's peak per pipeline rank (`Simulator.memory`) against each run's measured peak "
        "(`ranks[].memory`: the executor's live-tensor accounting on a CPU; the largest replica shown).",
        "",
        memory_table_markdown(memory) if memory else "(no run recorded its memory)",
        "",
    ]


def _md_figures() -> list[str]:
    """Links to the Gantt charts and the tuner's plots that :func:`_figures` writes."""
    return [
        "## Measured vs simulated timelines",
        "",
        "Tuned plan (top: one measured step of the executor; bottom: the calibrated simulation):",
        "",
        "![gantt tuned](figures/gantt_tuned.png)",
        "",
        "Default plan:",
        "",
        "![gantt default](figures/gantt_default.png)",
        "",
        "## Tuner (calibrated): Pareto front and convergence",
        "",
        "![pareto](figures/tune_calibrated_pareto.png)",
        "",
        "![convergence](figures/tune_calibrated_convergence.png)",
        "",
    ]


__all__ = ["Headline", "LoopFacts", "headline", "verdict", "write_report"]
