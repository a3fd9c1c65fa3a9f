"""What ``mindpipe tune --out DIR`` writes besides the sweep state.

* ``evaluations.csv`` / ``evaluations.parquet``: one row per evaluated point — the plan keys, its
  partition, status and reason, every metric, the objective value;
* ``best_plan.json``: the best feasible plan (a Plan document ``mindpipe run`` and ``mindpipe
  simulate`` accept) with ``made_for`` filled — the model and cluster, the trace and calibration
  it was priced with, and the what-if knobs it uses (values the executor does not carry out) —
  and ``best.json`` its metrics;
* ``pareto.csv``: the feasible plans no other beats on both throughput and carbon per sample;
* ``convergence.png`` (best value so far vs. simulations) and ``pareto.png``;
* ``summary.json``: what ``--json`` prints (:mod:`mindpipe.tuner.summary`, written by :func:`mindpipe.tuner.api.tune`);
* ``timeshift.json`` (``--objective carbon`` with a start window): the chosen start or run/pause
  hours, each segment's step to train until, and the carbon against the throughput-optimal plan
  started now (:mod:`mindpipe.tuner.timeshift`); its headline keys are also in the summary.

Every table row says which what-if knobs its plan uses (``what_if``), and the summary which knobs
were searched and which the best plan uses.

A supernet sweep (NASPipe) values plans in subnets trained per hour (``subnets_per_hour``; goodput
for supernets); its rows carry ``subnet_schedule``, ``subnet_window`` and
``equivalent_to_sequential`` (false for ``sync`` and ``async``, whose training is not sequential
training's), and its summary a ``supernet`` object saying so. The throughput-vs-carbon front
(``pareto.csv``, ``pareto.png``) is left out there: the supernet simulator prices no energy.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path
from typing import Any

from mindpipe.traces.atomic import figure, open_output, output_dir, save_figure, write_text
from mindpipe.traces.config import MadeFor, Plan
from mindpipe.traces.schema import to_dict, write_json
from mindpipe.traces.supernet import Supernet
from mindpipe.tuner.keys import OPTIONAL_POINT_KEYS, POINT_KEYS, SUPERNET_POINT_KEYS, what_if_used
from mindpipe.tuner.objectives import Objective, pareto_front
from mindpipe.tuner.records import ScoredRecord
from mindpipe.tuner.space import SearchSpace
from mindpipe.tuner.subnet_space import equivalent_to_sequential
from mindpipe.tuner.summary import METRIC_COLUMNS, TuneSummary, build_summary
from mindpipe.tuner.sweep import SweepResult
from mindpipe.tuner.timeshift import ShiftReport, write_report

COLUMNS = ("index", "status", "code", "feasible", "reason", "value", "simulated", "what_if", *POINT_KEYS,
           *SUPERNET_POINT_KEYS, "equivalent_to_sequential", "partition", *METRIC_COLUMNS, "message", "eval_s")


def rows(result: SweepResult) -> list[dict[str, Any]]:
    """Flat table rows (:data:`COLUMNS`), one per evaluated point, in evaluation order."""
    out = []
    for r in result.records:
        ev = r.evaluation
        partition = ev.plan.partition if ev.plan is not None else None
        row: dict[str, Any] = {"index": r.index, "status": ev.status.value,
                               "code": ev.code.value if ev.code is not None else "", "feasible": r.feasible,
                               "reason": r.verdict.value, "value": r.value, "simulated": ev.simulated,
                               "what_if": ",".join(r.what_if)}
        row.update({k: r.point.get(k, OPTIONAL_POINT_KEYS.get(k)) for k in POINT_KEYS})
        row.update({k: r.point.get(k) for k in SUPERNET_POINT_KEYS})
        row["equivalent_to_sequential"] = equivalent_to_sequential(r.point)
        row["partition"] = json.dumps(partition) if partition is not None else ""
        row.update({k: r.metrics.get(k) for k in METRIC_COLUMNS})
        row["message"] = r.message.splitlines()[0] if r.message else ""
        row["eval_s"] = ev.eval_s
        out.append(row)
    return out


def write_tables(table: list[dict[str, Any]], out: Path) -> list[Path]:
    """``evaluations.csv`` and ``evaluations.parquet``."""
    import pandas as pd

    df = pd.DataFrame(table, columns=list(COLUMNS))
    for col in ("value", *METRIC_COLUMNS, "eval_s"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    csv, parquet = out / "evaluations.csv", out / "evaluations.parquet"
    with open_output(csv, newline="") as fh:
        df.to_csv(fh, index=False)
    with open_output(parquet, binary=True) as fh:
        df.to_parquet(fh, index=False)
    return [csv, parquet]


def pareto_rows(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Feasible rows on the throughput-vs-carbon-per-sample front."""
    feasible = [r for r in table if r["feasible"]]
    return [feasible[i] for i in pareto_front(feasible)]


def _save(fig: Any, path: Path) -> None:
    """Lay out and write (safely) one figure."""
    fig.tight_layout()
    save_figure(fig, path, dpi=100)


def _plot_convergence(result: SweepResult, objective: Objective, path: Path) -> None:
    xs, ys, best, sims = [], [], None, 0
    each_x, each_y = [], []
    for r in result.records:
        sims += r.simulated
        if r.feasible and r.value is not None:
            each_x.append(sims)
            each_y.append(r.value)
            if best is None or objective.better(r.value, best):
                best = r.value
        if best is not None and r.simulated:
            xs.append(sims)
            ys.append(best)
    fig, ax = figure(figsize=(6, 4))
    ax.scatter(each_x, each_y, s=8, color="0.6", label="feasible plan evaluated")
    ax.step(xs, ys, where="post", label="best so far")
    ax.legend(fontsize=8)
    ax.set_xlabel("simulations")
    ax.set_ylabel(f"{objective.name} ({objective.unit})")
    # A long objective (a supernet's says what goodput counts) would run off both edges: wrapped.
    ax.set_title(textwrap.fill(f"convergence: {objective.describe()}", width=80), fontsize=9)
    ax.grid(alpha=0.3)
    _save(fig, path)


BUNCHED_FRONT = 0.1  # a front narrower than this share of the plot's carbon range gets a zoomed panel


def _front_label(row: dict[str, Any]) -> str:
    return (f"dp{row.get('dp')} tp{row.get('tp')} pp{row.get('pp')} mb{row.get('micro_batch_size')} "
            f"gb{row.get('global_batch_size')} {row.get('schedule')}")


def _plot_pareto(table: list[dict[str, Any]], front: list[dict[str, Any]], path: Path, where: str = "") -> None:
    """Throughput against carbon per sample of the feasible plans, the front marked; the title says
    what was tuned and when the front is one plan (the fastest is also the cleanest per sample).

    Front points often lie within a fraction of a per cent of each other while the plans around them
    span several times that (gpt-1.3b on 8 A100: three front plans within 0.7 %, the cloud 6×); then
    a second panel zooms on the front and names each of its plans, which the first draws as one dot."""
    feas = [r for r in table if r["feasible"]]
    xs = [r["carbon_per_sample_g"] for r in feas]
    fx = [r["carbon_per_sample_g"] for r in front]
    fy = [r["throughput_samples_per_s"] for r in front]
    span = (max(xs) - min(xs)) if xs else 0.0
    bunched = len(front) > 1 and span > 0 and max(fx) - min(fx) < BUNCHED_FRONT * span
    fig, axes = figure(1, 2 if bunched else 1, figsize=(11 if bunched else 6, 4))
    ax = axes[0] if bunched else axes
    ax.scatter(xs, [r["throughput_samples_per_s"] for r in feas], s=10, alpha=0.5, label="feasible plans")
    ax.plot(fx, fy, "o-", color="C3", label="Pareto front")
    ax.set_xlabel("carbon per sample (gCO2eq)")
    ax.set_ylabel("throughput (samples/s)")
    one = " — one plan: the fastest is also the cleanest" if len(front) == 1 else ""
    ax.set_title(f"Pareto front{': ' + where if where else ''}{one}", fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    if bunched:
        _plot_front_zoom(axes[1], feas, front)
    _save(fig, path)


def _plot_front_zoom(ax: Any, feas: list[dict[str, Any]], front: list[dict[str, Any]]) -> None:
    """The front alone, with a margin, each point named by its plan."""
    fx = [r["carbon_per_sample_g"] for r in front]
    fy = [r["throughput_samples_per_s"] for r in front]
    pad_x = (max(fx) - min(fx)) * 0.25 or abs(fx[0]) * 0.01
    pad_y = (max(fy) - min(fy)) * 0.25 or abs(fy[0]) * 0.01
    lo, hi = min(fx) - pad_x, max(fx) + pad_x
    near = [r for r in feas if lo <= r["carbon_per_sample_g"] <= hi
            and min(fy) - pad_y <= r["throughput_samples_per_s"] <= max(fy) + pad_y]
    ax.scatter([r["carbon_per_sample_g"] for r in near], [r["throughput_samples_per_s"] for r in near], s=10,
               alpha=0.5)
    ax.plot(fx, fy, "o-", color="C3")
    for r in front:  # named towards the panel's middle, so that no name runs off its edge
        right = r["carbon_per_sample_g"] > (lo + hi) / 2
        ax.annotate(_front_label(r), (r["carbon_per_sample_g"], r["throughput_samples_per_s"]),
                    textcoords="offset points", xytext=(-4 if right else 4, 4), ha="right" if right else "left",
                    fontsize=7)
    ax.set_xlim(lo, hi)
    ax.set_ylim(min(fy) - pad_y, max(fy) + pad_y)
    ax.set_xlabel("carbon per sample (gCO2eq)")
    ax.set_title(f"the front, zoomed ({len(front)} plans)", fontsize=9)
    ax.grid(alpha=0.3)


def best_plan(best: ScoredRecord | None, made_for: MadeFor) -> Plan | None:
    """The best plan with ``made_for`` filled in (the what-if knobs it uses included)."""
    if best is None or best.plan is None:
        return None
    return dataclasses.replace(best.plan, made_for=dataclasses.replace(made_for, what_if=what_if_used(best.plan)))


def write_outputs(result: SweepResult, objective: Objective, space: SearchSpace, out: Path,
                  made_for: MadeFor, plots: bool = True, timeshift: ShiftReport | None = None) -> TuneSummary:
    """Write every output file but ``summary.json`` and return the summary (``made_for``: what the
    sweep planned for); :func:`mindpipe.tuner.api.tune` writes the summary once its last step ran.

    ``timeshift`` (:func:`mindpipe.tuner.timeshift.report_for`): its headline keys join the
    summary and the whole report goes to ``timeshift.json``.

    Every file goes through :mod:`mindpipe.traces.atomic` (temporary file, renamed into place).
    """
    out = output_dir(out)
    table = rows(result)
    write_tables(table, out)
    front = pareto_rows(table)
    supernet = isinstance(space.model, Supernet)  # no energy, so no carbon front (nor its table or plot)
    if not supernet:
        import pandas as pd

        with open_output(out / "pareto.csv", newline="") as fh:
            pd.DataFrame(front, columns=list(table[0]) if table else None).to_csv(fh, index=False)
    plan = best_plan(result.best, made_for)
    if result.best is not None and plan is not None:
        write_json(plan, out / "best_plan.json")
        best = {"point": result.best.point, "plan": to_dict(plan), "metrics": result.best.metrics.to_json(),
                "value": result.best.value, "what_if": result.best.what_if}
        write_text(out / "best.json", json.dumps(best, indent=1, default=str) + "\n")
    plotted = bool(plots and table)
    if plotted:
        _plot_convergence(result, objective, out / "convergence.png")
        if not supernet:
            _plot_pareto(table, front, out / "pareto.png", made_for.describe())
    info = build_summary(result, objective, space, out, len(front), plan)
    if timeshift is not None:
        info.timeshift = timeshift
        write_report(timeshift, out)
    info.written = [*(["best_plan.json", "best.json"] if result.best is not None and plan is not None else []),
                    "evaluations.csv/.parquet", *([] if supernet else ["pareto.csv"]),
                    *((["convergence.png"] + ([] if supernet else ["pareto.png"])) if plotted else []),
                    *(["timeshift.json"] if timeshift is not None else [])]
    return info


__all__ = ["COLUMNS", "METRIC_COLUMNS", "best_plan", "pareto_rows", "rows", "write_outputs", "write_tables"]
