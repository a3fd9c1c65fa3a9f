"""The closed loop on this machine's CPU: profile → tune → run → calibrate → re-tune → report.

``mindpipe demo`` (and ``make demo``) runs it for ``gpt-mini`` on up to 4 CPU ranks:

1. **profile** the model layer by layer (``traces.profiler``);
2. **tune** every plan for the ranks with the simulator, on the profiled trace (uncalibrated);
3. **run** the tuned plan, the default plan (pipeline over all ranks, even split, ``1f1b``,
   micro-batch 1 as torchtitan's defaults) and
   a few probe plans that cover what the others may not (tensor and data parallelism) with the
   executor, measuring each;
4. **calibrate** the simulator on those runs (:mod:`mindpipe.simulator.calibrate`);
5. **re-tune** with the calibrated simulator and run its choice, plus plans held out of the fit;
6. **report**: ``report.md`` with the measured speedup of the tuned plan over the default, the
   fidelity of the simulator before and after calibration on the held-out runs (table and
   scatter), the tuner's Pareto front, and the measured vs simulated Gantt of the tuned plan.

Every figure in the report is measured or simulated in this run; nothing is copied in.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mindpipe.runs import RunSpec, run_plan
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
from mindpipe.simulator.calibrate.fit import calibrate
from mindpipe.simulator.calibrate.runs import MeasuredRun, load_run, measured_events, merge_repeats
from mindpipe.simulator.timeline import write_gantts
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.calibration import Calibration, save_calibration
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.schema import from_dict, to_dict
from mindpipe.traces.trace import Trace


def _plan(**kw: Any) -> Plan:
    return Plan(**{"precision": "fp32", "global_batch_size": 32, **kw})


@dataclass
class LoopConfig:
    """What the loop runs.

    Attributes:
        model: Built-in name or model file.
        ranks: CPU ranks (one node).
        global_batch: Samples per iteration (every plan).
        micro_batch: The default plan's micro-batch size: 1, torchtitan's default
            (``pipeline_parallel_microbatch_size``), as a user who does not tune gets.
        profile_micro_batch: Micro-batch size the model is profiled at.
        run: Steps, warm-up and profiling of each executor run.
        probes: Extra plans run for the calibration (their ``global_batch_size`` is replaced).
        holdout: Extra plans run only to check the calibrated predictions.
        out: Output directory.
    """

    model: str = "gpt-mini"
    ranks: int = 4
    global_batch: int = 32
    micro_batch: int = 1
    profile_micro_batch: int = 4
    run: RunSpec = field(default_factory=RunSpec)
    probes: list[Plan] = field(default_factory=lambda: [_plan(tp=2, pp=2, micro_batch_size=4),
                                                        _plan(dp=4, micro_batch_size=8)])
    holdout: list[Plan] = field(default_factory=lambda: [_plan(dp=2, pp=2, micro_batch_size=2, schedule="gpipe"),
                                                         _plan(dp=2, tp=2, micro_batch_size=4)])
    out: Path = Path("results")

    def fitted(self, plan: Plan) -> Plan:
        """``plan`` at this loop's global batch."""
        return from_dict(Plan, {**to_dict(plan), "global_batch_size": self.global_batch}, "plan")


@dataclass
class LoopResult:
    """Where everything went and the headline figures."""

    report: Path
    default_s: float
    tuned_s: float
    speedup: float
    holdout: dict[str, Any]
    calibration: Calibration


def _tune(model: Model, cfg: LoopConfig, out: Path, trace: Trace | None,
          calibration: Calibration | None) -> tuple[Plan, int]:
    """The best plan and how many plans were simulated."""
    from mindpipe.tuner.api import tune
    from mindpipe.tuner.sweep import SweepConfig

    # The space of 4 ranks is small (about a thousand plans): search it exhaustively. Pinned to
    # what the executor runs here: fp32 (bf16 matmuls on this CPU are no faster end to end), and
    # gradients reduced after the last backward (torch.distributed.pipelining does not overlap them).
    outcome = tune(model, load_cluster(f"cpu:1x{cfg.ranks}"), out=out, global_batch=cfg.global_batch,
                   fixes=["precision=fp32", "overlap_grad_reduce=false"], trace=trace, calibration=calibration,
                   config=SweepConfig(optimizer="grid", budget=100_000, workers=1), plots=True)
    return from_dict(Plan, outcome.summary["best_plan"], "best_plan"), int(outcome.summary["evaluations"])


def closed_loop(cfg: LoopConfig, log: Callable[[str], None] | None = None) -> LoopResult:
    """Run the loop (module docstring) and write ``cfg.out / report.md``."""
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    t_start = time.perf_counter()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model = load_model(cfg.model)

    def step(msg: str) -> None:
        say(f"[{time.perf_counter() - t_start:5.0f} s] {msg}")

    step(f"1/6 profiling {model.label} on the CPU")
    from mindpipe.traces.profiler import ProfileOptions, profile_model

    trace = profile_model(model, ProfileOptions(micro_batch_size=cfg.profile_micro_batch, repeats=5, step_repeats=0),
                          command="mindpipe demo")
    trace.save(out / f"{cfg.model}.trace.json")

    step("2/6 tuning (uncalibrated: profiled layer times, dedicated devices)")
    tuned1, simulated = _tune(model, cfg, out / "tune-uncalibrated", trace, None)
    default = _plan(pp=cfg.ranks, micro_batch_size=cfg.micro_batch, global_batch_size=cfg.global_batch)

    measured: dict[tuple[str, int], MeasuredRun] = {}

    def key(plan: Plan) -> str:
        return json.dumps(to_dict(plan), sort_keys=True)

    def measure(plan: Plan, rnd: int = 0) -> MeasuredRun:
        if (key(plan), rnd) not in measured:
            name = plan_label(plan).replace("·", "-").replace(" ", "_").replace("[", "").replace("]", "").replace(",", "-")
            path = out / "measured" / (f"{name}.json" if rnd == 0 else f"{name}.round{rnd}.json")
            step(f"   running {plan_label(plan)} on {plan.world_size} CPU ranks" + (f" (round {rnd + 1})" if rnd else ""))
            run_plan(plan, model, path, cfg.run)
            measured[(key(plan), rnd)] = load_run(path)
        return measured[(key(plan), rnd)]

    def rounds_of(plan: Plan) -> list[MeasuredRun]:
        return [r for (k, _), r in sorted(measured.items()) if k == key(plan)]

    def combined(plan: Plan) -> MeasuredRun:
        """The plan's runs as one: the median of its rounds' iteration times."""
        return merge_repeats(rounds_of(plan))[0]

    def unique(plans: list[Plan]) -> list[Plan]:
        return list({key(p): p for p in plans}.values())

    step("3/6 running the default plan, the tuned plan and the calibration probes")
    fit_plans = unique([default, tuned1] + [cfg.fitted(p) for p in cfg.probes])
    fit_runs = [measure(p) for p in fit_plans]

    step(f"4/6 calibrating on {len(fit_runs)} runs")
    cal, notes = calibrate(fit_runs)
    save_calibration(cal, out / "calibration.json")
    for w in notes.warnings:
        say(f"   warning: {w}")

    step("5/6 re-tuning with the calibrated simulator; running its plan and the held-out plans")
    tuned2, _ = _tune(model, cfg, out / "tune-calibrated", None, cal)
    held_plans = [p for p in unique([tuned2] + [cfg.fitted(p) for p in cfg.holdout]) if key(p) not in map(key, fit_plans)]
    for p in held_plans:
        measure(p)
    # The speedup compares two plans measured minutes apart, and this machine's speed drifts between
    # runs: a second round of both, interleaved, and the median of each.
    for p in unique([default, tuned2]):
        measure(p, 1)

    step("6/6 writing the report")
    rounds = ([r.iteration_s for r in rounds_of(default)], [r.iteration_s for r in rounds_of(tuned2)])
    res = _report(cfg, model, out, trace, simulated, default, tuned1, tuned2, combined, [combined(p) for p in fit_plans],
                  [combined(p) for p in held_plans], cal, notes.warnings, rounds)
    step(f"done: {res.report}")
    return res


def _verdict(speedup: float) -> str:
    """How a speedup reads: "1.2× faster than", "0.9× as fast as"."""
    return "faster than" if speedup >= 1 else "as fast as"


def _gantt(run: MeasuredRun, cal: Calibration, path: Path) -> None:
    sim = simulate(run.model, run.cluster, run.plan, SimulationOptions(calibration=cal, timeline=True))
    events = measured_events(run)
    span = max((e["end_s"] for e in events), default=0.0)
    write_gantts([(events, f"measured: {plan_label(run.plan)}, one step ({span:.2f} s of actions), pipeline of dp 0, tp 0"),
                  (sim.timeline or [], f"simulated, calibrated: iteration {sim.iteration_time_s:.2f} s")], path)


def _report(cfg: LoopConfig, model: Model, out: Path, trace: Trace, simulated: int, default: Plan, tuned1: Plan,
            tuned2: Plan,
            measure: Callable[[Plan], MeasuredRun], fit_runs: list[MeasuredRun], held_runs: list[MeasuredRun],
            cal: Calibration, warnings: Sequence[str], rounds: tuple[list[float], list[float]]) -> LoopResult:
    figs = out / "figures"
    figs.mkdir(parents=True, exist_ok=True)
    d_run, t1_run, t2_run = measure(default), measure(tuned1), measure(tuned2)
    fit_rows = fidelity(fit_runs, cal)
    held_rows = fidelity(held_runs, cal)
    scatter_png(held_rows, figs / "calibration_scatter.png", fitted=fit_rows,
                title=f"{model.label} on {cfg.ranks} CPU ranks: predicted vs measured")
    _gantt(t2_run, cal, figs / "gantt_tuned.png")
    _gantt(d_run, cal, figs / "gantt_default.png")
    for name in ("pareto.png", "convergence.png"):
        src = out / "tune-calibrated" / name
        if src.exists():
            shutil.copyfile(src, figs / f"tune_calibrated_{name}")
    speedup = d_run.iteration_s / t2_run.iteration_s
    spread = max((100 * (max(r) - min(r)) / min(r) for r in rounds if len(r) > 1), default=0.0)
    s = summary(held_rows)

    def row(role: str, run: MeasuredRun, rows: list[FidelityRow]) -> str:
        r = next(x for x in rows if x.name == run.name)
        cal_s = f"{r.calibrated_s:.3f}" if r.calibrated_s is not None else "—"
        return (f"| {role} | {r.plan} | {r.uncalibrated_s:.3f} | {cal_s} | {r.measured_s:.3f} | "
                f"{d_run.iteration_s / r.measured_s:.2f}× |")

    all_rows = fit_rows + held_rows  # the default and both tuned plans are among them
    lines = [
        f"# MindPipe closed loop: {model.label} on {cfg.ranks} CPU ranks",
        "",
        f"Written by `mindpipe demo` on {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')} "
        f"({platform.processor() or platform.machine()}, Python {platform.python_version()}). "
        f"Every figure below was measured or simulated in this run. Global batch {cfg.global_batch}, "
        f"{cfg.run.steps} steps per run ({cfg.run.warmup_steps} warm-up, the last one profiled), "
        "iteration time = median of the remaining steps; the default and tuned plans ran twice, "
        "interleaved, and their time is the mean of the two runs (this machine's speed drifts between runs).",
        "",
        "## Result",
        "",
        f"**The tuned plan ({plan_label(tuned2)}) trains {speedup:.2f}× {_verdict(speedup)} the default plan "
        f"({plan_label(default)}), measured: {t2_run.iteration_s:.3f} s vs {d_run.iteration_s:.3f} s per iteration.**",
        "",
        f"Each round alone: default {', '.join(f'{t:.3f}' for t in rounds[0])} s; tuned "
        f"{', '.join(f'{t:.3f}' for t in rounds[1])} s. The rounds of one plan differ by up to {spread:.0f} %: "
        + ("the difference is larger than that drift." if abs(speedup - 1) * 100 > spread else
           "the difference between the two plans is within that drift, so this run cannot tell them apart."),
        "",
        "| plan | | predicted, uncalibrated s | predicted, calibrated s | measured s | speedup vs default |",
        "|---|---|---:|---:|---:|---:|",
        row("default (even split, 1f1b)", d_run, all_rows),
        row("tuned before calibration", t1_run, all_rows),
        row("tuned after calibration", t2_run, all_rows),
        "",
        "## What happened",
        "",
        f"1. **Profile**: per-layer CPU times of {model.label} at micro-batch {cfg.profile_micro_batch} "
        f"(`{cfg.model}.trace.json`, {len(trace.layers)} layers).",
        f"2. **Tune, uncalibrated**: {simulated} plans simulated on the profiled trace; "
        f"best: {plan_label(tuned1)}.",
        f"3. **Run**: {len(fit_runs)} plans with `mindpipe run` (default, tuned, probes), files in `measured/`.",
        "4. **Calibrate** on those runs (`calibration.json`):",
        "",
        "```",
        format_calibration(cal),
        "```",
        *(f"   warning: {w}" for w in warnings),
        "",
        f"5. **Re-tune with the calibration**: best {plan_label(tuned2)} "
        f"(Pareto front of throughput vs carbon below).",
        "",
        "## Fidelity on plans the calibration did not see",
        "",
        table_markdown(held_rows),
        "",
        f"Held-out MAPE: uncalibrated {s.get('mape_uncalibrated_pct', float('nan')):.1f}%, "
        f"calibrated {s.get('mape_calibrated_pct', float('nan')):.1f}%.",
        "",
        "![calibration scatter](figures/calibration_scatter.png)",
        "",
        "Runs the calibration was fitted on (in-sample):",
        "",
        table_markdown(fit_rows),
        "",
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
    report = out / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    (out / "report.json").write_text(json.dumps({
        "default_plan": to_dict(default), "tuned_plan_uncalibrated": to_dict(tuned1), "tuned_plan": to_dict(tuned2),
        "measured_default_s": d_run.iteration_s, "measured_tuned_s": t2_run.iteration_s, "speedup": speedup,
        "holdout": s, "holdout_rows": [vars(r) for r in held_rows], "fitted_rows": [vars(r) for r in fit_rows],
    }, indent=1) + "\n", encoding="utf-8")
    return LoopResult(report, d_run.iteration_s, t2_run.iteration_s, speedup, s, cal)


__all__ = ["LoopConfig", "LoopResult", "closed_loop"]
