"""Predicted vs measured iteration time of measured runs, before and after calibration.

The fidelity report of the closed loop: for runs that were *not* used to calibrate, how far the
uncalibrated simulator (catalog hardware model, dedicated devices) and the calibrated one are
from what the executor measured — a table (Markdown or text) and a scatter plot.
:func:`fidelity_report` is the one place that assembles them (``mindpipe calibrate --report``
and ``mindpipe validate measured --report`` both call it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from mindpipe.simulator.api import SimulationOptions, simulate
from mindpipe.simulator.calibrate.runs import MeasuredRun
from mindpipe.traces.atomic import figure, output_dir, save_figure, write_text
from mindpipe.traces.calibration import Calibration
from mindpipe.traces.config import Plan
from mindpipe.traces.units import plural


def plan_label(plan: Plan) -> str:
    """A short human label of a plan: ``dp2·tp1·pp2 1f1b mb4`` (``·cp2`` under context parallelism, ``cuts
    a|a`` for boundaries inside blocks)."""
    label = f"dp{plan.dp}·tp{plan.tp}·pp{plan.pp}" + (f"·cp{plan.cp}" if plan.cp > 1 else "") + f" {plan.schedule}"
    if plan.virtual_stages > 1:
        label += f" v{plan.virtual_stages}"
    label += f" mb{plan.micro_batch_size}"
    extras = [("sp", plan.sequence_parallel), (f"rc-{plan.recompute}", plan.recompute != "none"),
              (f"zero{plan.zero_stage}", plan.zero_stage > 0), (plan.precision, plan.precision != "fp32")]
    label += "".join(f" {name}" for name, on in extras if on)
    if plan.partition and plan.num_stages > 1:
        label += " [" + ",".join(str(n) for n in plan.partition) + "]"
    if plan.cuts_inside_blocks and plan.stage_cuts is not None:
        # Where each boundary falls: "|" between blocks, "a" after a block's attention.
        label += " cuts " + "".join("a" if c == "after_attention" else "|" for c in plan.stage_cuts)
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


@dataclass(frozen=True, slots=True)
class FidelitySummary:
    """MAPE and largest error (percent) of a set of runs before and after calibration.

    The uncalibrated figures are None for no runs; the calibrated ones (and ``improvement_factor``,
    uncalibrated ÷ calibrated MAPE) are None without a calibration.
    """

    n: int
    mape_uncalibrated_pct: float | None = None
    max_abs_error_uncalibrated_pct: float | None = None
    mape_calibrated_pct: float | None = None
    max_abs_error_calibrated_pct: float | None = None
    improvement_factor: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``--json`` and ``report.json``: the figures that exist (``{"n": 0}`` for no runs)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def summary(rows: list[FidelityRow]) -> FidelitySummary:
    """MAPE (percent) before and after calibration, their ratio, and the worst errors."""
    if not rows:
        return FidelitySummary(0)
    before = [abs(r.uncalibrated_error) for r in rows]
    after = [abs(e) for r in rows if (e := r.calibrated_error) is not None]
    mape_before = 100 * sum(before) / len(rows)
    if not after:
        return FidelitySummary(len(rows), mape_before, 100 * max(before))
    mape_after = 100 * sum(after) / len(after)
    return FidelitySummary(len(rows), mape_before, 100 * max(before), mape_after, 100 * max(after),
                           mape_before / mape_after if mape_after > 0 else float("inf"))


def table_markdown(rows: list[FidelityRow]) -> str:
    """A Markdown table of the rows and a MAPE line."""
    lines = ["| run | plan | ranks | measured s | uncalibrated s (error) | calibrated s (error) |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        cal = "—" if r.calibrated_s is None else f"{r.calibrated_s:.3f} ({100 * (r.calibrated_error or 0):+.1f}%)"
        lines.append(f"| {r.name} | {r.plan} | {r.ranks} | {r.measured_s:.3f} | "
                     f"{r.uncalibrated_s:.3f} ({100 * r.uncalibrated_error:+.1f}%) | {cal} |")
    if rows:
        lines.append(f"\nMAPE {_mape_phrase(rows, '×')}, over {plural(len(rows), 'run')}.")
    return "\n".join(lines)


def _mape_phrase(rows: list[FidelityRow], times: str) -> str:
    """``uncalibrated X%, calibrated Y% (Z× lower)`` (the calibrated part only with a calibration)."""
    s = summary(rows)
    phrase = f"uncalibrated {s.mape_uncalibrated_pct:.1f}%"
    if s.mape_calibrated_pct is not None:
        phrase += f", calibrated {s.mape_calibrated_pct:.1f}%"
        # Below 0.05 % the fit reproduces its own data (as many constants as groups): no ratio to show.
        phrase += f" ({s.improvement_factor:.1f}{times} lower)" if s.mape_calibrated_pct >= 0.05 else " (fits its own data exactly)"
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
    fig, ax = figure(figsize=(6.4, 5.4))
    # the axes span what is drawn: held-out points both ways, fitted ones calibrated only
    values = [v for r in rows for v in (r.measured_s, r.uncalibrated_s, r.calibrated_s or r.measured_s)]
    values += [v for r in fitted or [] for v in (r.measured_s, r.calibrated_s or r.measured_s)]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="predicted = measured")
    ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], color="grey", alpha=0.15, label="±15%")
    s = summary(rows)
    ax.scatter([r.measured_s for r in rows], [r.uncalibrated_s for r in rows], marker="x", color="tab:red",
               label=f"uncalibrated (held-out MAPE {s.mape_uncalibrated_pct or 0:.1f}%)")
    cal_rows = [r for r in rows if r.calibrated_s is not None]
    if cal_rows:
        ax.scatter([r.measured_s for r in cal_rows], [float(r.calibrated_s or 0) for r in cal_rows], marker="o",
                   color="tab:blue", label=f"calibrated (held-out MAPE {s.mape_calibrated_pct or 0:.1f}%)")
    fit_rows = [r for r in fitted or [] if r.calibrated_s is not None]
    if fit_rows:
        ax.scatter([r.measured_s for r in fit_rows], [float(r.calibrated_s or 0) for r in fit_rows], marker="o",
                   facecolors="none", edgecolors="tab:blue", label="calibrated, runs it was fitted on")
    middle = (lo * hi) ** 0.5  # log scale: a label right of the middle goes to the point's left, inside the axes
    for r in rows:
        if r.calibrated_s is not None:
            right = r.measured_s > middle
            ax.annotate(r.plan, (r.measured_s, r.calibrated_s), fontsize=6, xytext=(-4 if right else 4, -3),
                        textcoords="offset points", ha="right" if right else "left")
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    # Ticks at 1, 2 and 5 of each decade, labelled: the demo's 0.1–2 s range had one readable tick
    # per axis with only powers of ten labelled.
    for axis in (ax.xaxis, ax.yaxis):  # after set_*scale, which resets the locators and formatters
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FormatStrFormatter("%.3g"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured iteration time (s)")
    ax.set_ylabel("predicted iteration time (s)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    out = Path(path)
    save_figure(fig, out, dpi=120)
    return out


def _g(value: float) -> str:
    """A fitted constant to three significant figures; ``0`` for one the fit left at zero up to float
    noise (a TP byte's CPU cost printed as 1.68e-16 ns)."""
    return "0" if abs(value) < 1e-9 else f"{value:.3g}"


def format_calibration(cal: Calibration) -> str:
    """The fitted constants of a calibration, one line each (terminal and Markdown code block), to three
    significant figures: a constant the fit left at zero prints ``0``, a small one its digits (fixed
    decimals printed both as ``0.00``)."""
    lines = []
    for name, dev in cal.devices.items():
        for precision, c in dev.compute.items():
            scales = ", ".join(f"{k} ×{v:.3g}" for k, v in c.scale.items())
            lines.append(f"compute {name} {precision} ({c.threads_per_rank} thread(s)/rank): {scales}; "
                         f"{_g(1e6 * c.op_overhead_s)} µs per op (+{_g(1e6 * c.tp_op_overhead_s)} µs tensor-parallel, "
                         f"+{_g(1e9 * c.tp_comm_cpu_s_per_byte)} ns CPU per TP byte sent); "
                         + (f"{_g(1e3 * c.dp_unit_overhead_s)} ms per data-parallel-wrapped module per forward "
                            "and backward; " if c.dp_unit_overhead_s else "")
                         + (f"{_g(1e9 * c.fresh_s_per_byte)} ns per byte of fresh large results; " if c.fresh_s_per_byte else "")
                         + (f"swap {_g(1e9 * c.swap_s_per_byte)} ns per swapped byte copied "
                            f"({1e-9 / c.swap_s_per_byte:.1f} GB/s); " if c.swap_s_per_byte else "")
                         + (f"split backward {_g(1e6 * c.split_input_op_s)} µs per op I walks, "
                            f"{_g(1e6 * c.weight_pass_s)} µs per W pass + {_g(1e6 * c.weight_pass_op_s)} µs per op it walks; "
                            if c.split_input_op_s or c.weight_pass_s or c.weight_pass_op_s else "")
                         + f"optimizer {_g(1e3 * c.optimizer_overhead_s)} ms + {_g(1e9 * c.optimizer_s_per_param)} ns/param; "
                         + (f"actions ×{c.trace_scale:.3f} the per-candidate profile's times; " if c.trace_scale else "")
                         + f"fit on {plural(c.samples, 'action group')}, MAPE {100 * c.fit_mape:.1f}%")
        shared = f"; {dev.cpus_per_node} CPUs per host shared by its ranks" if dev.cpus_per_node else ""
        if dev.host_samples:
            lines.append(f"host work {name}: {1e3 * dev.step_cpu_s:.1f} ms CPU per iteration + "
                         f"{_g(1e6 * dev.op_cpu_s)} µs per op outside the actions; fit on {plural(dev.host_samples, 'rank')}, "
                         f"MAPE {100 * dev.host_fit_mape:.1f}%")
        lines.append(f"step overhead {name}: {1e3 * dev.step_overhead_s:.1f} ms per iteration{shared}")
    for backend, links in cal.comm.items():
        for link, lc in links.items():
            lines.append(f"comm {backend} {link}: {1e6 * lc.step_latency_s:.1f} µs per step, "
                         f"{lc.bandwidth_Bps / 1e9:.3g} GB/s; fit on {plural(lc.samples, 'collective')}, MAPE {100 * lc.fit_mape:.1f}%")
            if lc.cpu_s_per_step or lc.cpu_s_per_byte:
                lines.append(f"comm {backend} {link} host copies: {1e6 * lc.cpu_s_per_step:.1f} µs CPU per step + "
                             f"{1e9 * lc.cpu_s_per_byte:.2f} ns CPU per byte, on the cores the ranks share")
            if lc.tp_wait_s:
                lines.append(f"comm {backend} {link} wait for peers: {1e3 * lc.tp_wait_s:.2f} ms per blocking collective "
                             "(fitted on the tensor-parallel ones, as with a core per rank; data-parallel ones "
                             "wait the same), off the cores")
    noise = cal.gradient_noise
    if noise is not None:
        lines.append(f"gradient noise scale {noise.model.label}: {noise.noise_scale:.4g} samples (critical batch for "
                     f"goodput), from {plural(len(noise.runs), 'run')}, {plural(noise.samples, 'sample')}, data {', '.join(noise.data)}")
    return "\n".join(lines)


def fidelity_report(rows: list[FidelityRow], fitted: list[FidelityRow] | None = None, *,
                    report_dir: str | Path | None = None, title: str = "Predicted vs measured",
                    preface: Sequence[str] = (), print_to: TextIO | None = None) -> list[Path]:
    """Print the predicted-vs-measured table(s) and write ``fidelity.md`` and the scatter plot.

    Args:
        rows: The runs being judged: held-out runs when ``fitted`` is given, else every run.
        fitted: The runs a calibration was fitted on (in-sample), shown in their own section
            and drawn hollow in the scatter; None when there is no such split.
        report_dir: Where to write ``fidelity.md`` and ``calibration_scatter.png`` (created if
            missing); None writes nothing.
        title: The Markdown document's heading.
        preface: Markdown lines between the heading and the tables (e.g. the fitted constants).
        print_to: Stream for the plain-text tables; None prints nothing (``--json``).

    Returns:
        The files written, ``fidelity.md`` first (empty without ``report_dir``).
    """
    # (section heading in Markdown, label on the terminal, rows); a lone set of rows gets neither.
    sections = [("Runs the calibration was fitted on", "runs fitted on (in-sample):", fitted or []),
                ("Held-out runs", "held-out runs:", rows)] if fitted else [("", "", rows)]
    sections = [s for s in sections if s[2]]
    if print_to is not None:
        print("\n\n".join((f"{label}\n" if label else "") + table_text(part) for _, label, part in sections),
              file=print_to)
    if report_dir is None:
        return []
    out = output_dir(report_dir)
    md = [f"# {title}", "", *preface] + [line for heading, _, part in sections
                                         for line in ([f"## {heading}", ""] if heading else []) + [table_markdown(part), ""]]
    write_text(out / "fidelity.md", "\n".join(md) + "\n")
    png = scatter_png(rows or fitted or [], out / "calibration_scatter.png", fitted=fitted if rows else None)
    return [out / "fidelity.md", png]


__all__ = ["FidelityRow", "FidelitySummary", "fidelity", "fidelity_report", "format_calibration", "plan_label", "scatter_png", "summary",
           "table_markdown", "table_text"]
