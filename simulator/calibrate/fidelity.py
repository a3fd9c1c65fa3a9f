"""Predicted vs measured iteration time of measured runs, before and after calibration.

The fidelity report of the closed loop: for runs that were *not* used to calibrate, how far the
uncalibrated simulator (catalog hardware model, dedicated devices) and the calibrated one are
from what the executor measured — a table (Markdown or text) and a scatter plot.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindpipe.simulator.api import SimulationOptions, simulate
from mindpipe.simulator.calibrate.runs import MeasuredRun
from mindpipe.traces.calibration import Calibration
from mindpipe.traces.config import Plan


def plan_label(plan: Plan) -> str:
    """A short human label of a plan: ``dp2·tp1·pp2 1f1b mb4``."""
    label = f"dp{plan.dp}·tp{plan.tp}·pp{plan.pp} {plan.schedule}"
    if plan.virtual_stages > 1:
        label += f" v{plan.virtual_stages}"
    label += f" mb{plan.micro_batch_size}"
    extras = [("sp", plan.sequence_parallel), (f"rc-{plan.recompute}", plan.recompute != "none"),
              (f"zero{plan.zero_stage}", plan.zero_stage > 0), (plan.precision, plan.precision != "fp32")]
    label += "".join(f" {name}" for name, on in extras if on)
    if plan.partition:
        label += " [" + ",".join(str(n) for n in plan.partition) + "]"
    return label


@dataclass
class FidelityRow:
    """One run: measured and predicted iteration seconds (``calibrated_s`` None without a calibration)."""

    name: str
    plan: str
    ranks: int
    measured_s: float
    uncalibrated_s: float
    calibrated_s: float | None

    @property
    def uncalibrated_error(self) -> float:
        """Signed relative error of the uncalibrated prediction."""
        return self.uncalibrated_s / self.measured_s - 1.0

    @property
    def calibrated_error(self) -> float | None:
        """Signed relative error of the calibrated prediction."""
        return None if self.calibrated_s is None else self.calibrated_s / self.measured_s - 1.0


def fidelity(runs: list[MeasuredRun], calibration: Calibration | None) -> list[FidelityRow]:
    """Simulate every run without and (if given) with ``calibration``."""
    rows = []
    for run in runs:
        before = simulate(run.model, run.cluster, run.plan).iteration_time_s
        after = None
        if calibration is not None:
            after = simulate(run.model, run.cluster, run.plan, SimulationOptions(calibration=calibration)).iteration_time_s
        rows.append(FidelityRow(run.name, plan_label(run.plan), run.plan.world_size, run.iteration_s, before, after))
    return rows


def summary(rows: list[FidelityRow]) -> dict[str, Any]:
    """MAPE (percent) before and after calibration, their ratio, and the worst errors."""
    if not rows:
        return {"n": 0}
    before = [abs(r.uncalibrated_error) for r in rows]
    out: dict[str, Any] = {"n": len(rows), "mape_uncalibrated_pct": 100 * sum(before) / len(rows),
                           "max_abs_error_uncalibrated_pct": 100 * max(before)}
    after = [abs(e) for r in rows if (e := r.calibrated_error) is not None]
    if after:
        out["mape_calibrated_pct"] = 100 * sum(after) / len(after)
        out["max_abs_error_calibrated_pct"] = 100 * max(after)
        out["improvement_factor"] = (out["mape_uncalibrated_pct"] / out["mape_calibrated_pct"]
                                     if out["mape_calibrated_pct"] > 0 else float("inf"))
    return out


def table_markdown(rows: list[FidelityRow]) -> str:
    """A Markdown table of the rows and a MAPE line."""
    lines = ["| run | plan | ranks | measured s | uncalibrated s (error) | calibrated s (error) |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        cal = "—" if r.calibrated_s is None else f"{r.calibrated_s:.3f} ({100 * (r.calibrated_error or 0):+.1f}%)"
        lines.append(f"| {r.name} | {r.plan} | {r.ranks} | {r.measured_s:.3f} | "
                     f"{r.uncalibrated_s:.3f} ({100 * r.uncalibrated_error:+.1f}%) | {cal} |")
    if rows:
        lines.append(f"\nMAPE {_mape_phrase(rows, '×')}, over {len(rows)} runs.")
    return "\n".join(lines)


def _mape_phrase(rows: list[FidelityRow], times: str) -> str:
    """``uncalibrated X%, calibrated Y% (Z× lower)`` (the calibrated part only with a calibration)."""
    s = summary(rows)
    phrase = f"uncalibrated {s['mape_uncalibrated_pct']:.1f}%"
    if "mape_calibrated_pct" in s:
        phrase += f", calibrated {s['mape_calibrated_pct']:.1f}% ({s['improvement_factor']:.1f}{times} lower)"
    return phrase


def table_text(rows: list[FidelityRow]) -> str:
    """A plain-text table for the terminal."""
    head = f"{'run':24s} {'plan':34s} {'ranks':>5s} {'measured':>9s} {'uncal.':>9s} {'err':>8s} {'calib.':>9s} {'err':>8s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        cal = ("", "") if r.calibrated_s is None else (f"{r.calibrated_s:9.3f}", f"{100 * (r.calibrated_error or 0):+7.1f}%")
        lines.append(f"{r.name[:24]:24s} {r.plan[:34]:34s} {r.ranks:5d} {r.measured_s:9.3f} {r.uncalibrated_s:9.3f} "
                     f"{100 * r.uncalibrated_error:+7.1f}% {cal[0]:>9s} {cal[1]:>8s}")
    if rows:
        lines.append(f"MAPE: {_mape_phrase(rows, 'x')}")
    return "\n".join(lines)


def scatter_png(rows: list[FidelityRow], path: str | Path, title: str = "Predicted vs measured iteration time",
                fitted: list[FidelityRow] | None = None) -> Path:
    """Scatter of predicted vs measured seconds (log-log, with the y = x line and ±15% band).

    ``rows`` are the held-out runs; ``fitted`` (optional) the runs the calibration was fitted
    on, drawn hollow so the two are not confused.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 5.4))
    allrows = rows + (fitted or [])
    values = [v for r in allrows for v in (r.measured_s, r.uncalibrated_s, r.calibrated_s or r.measured_s)]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="predicted = measured")
    ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], color="grey", alpha=0.15, label="±15%")
    s = summary(rows)
    ax.scatter([r.measured_s for r in rows], [r.uncalibrated_s for r in rows], marker="x", color="tab:red",
               label=f"uncalibrated (held-out MAPE {s.get('mape_uncalibrated_pct', 0):.0f}%)")
    cal_rows = [r for r in rows if r.calibrated_s is not None]
    if cal_rows:
        ax.scatter([r.measured_s for r in cal_rows], [float(r.calibrated_s or 0) for r in cal_rows], marker="o",
                   color="tab:blue", label=f"calibrated (held-out MAPE {s.get('mape_calibrated_pct', 0):.1f}%)")
    fit_rows = [r for r in fitted or [] if r.calibrated_s is not None]
    if fit_rows:
        ax.scatter([r.measured_s for r in fit_rows], [float(r.calibrated_s or 0) for r in fit_rows], marker="o",
                   facecolors="none", edgecolors="tab:blue", label="calibrated, runs it was fitted on")
    for r in rows:
        if r.calibrated_s is not None:
            ax.annotate(r.plan, (r.measured_s, r.calibrated_s), fontsize=6, xytext=(4, -3), textcoords="offset points")
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):  # after set_*scale, which resets the formatters
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured iteration time (s)")
    ax.set_ylabel("predicted iteration time (s)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


__all__ = ["FidelityRow", "fidelity", "plan_label", "scatter_png", "summary", "table_markdown", "table_text"]
