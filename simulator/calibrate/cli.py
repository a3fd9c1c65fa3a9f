"""``mindpipe calibrate``: fit the simulator's constants to measured runs (torch-free).

    mindpipe calibrate m1.json m2.json ... --out calibration.json [--holdout h1.json ...] [--report DIR]

Reads measured traces written by ``mindpipe run``, fits compute, communication, host CPU and step
overhead (:mod:`mindpipe.simulator.calibrate.fit`), writes the calibration file and prints what was fitted
and how well it explains the runs it came from. With ``--holdout``, runs *not* used in the fit are
predicted before and after calibration (the fidelity report); ``--report DIR`` also writes that
table as Markdown and the scatter plot as PNG. ``--json`` prints one object on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``calibrate`` subcommand to ``subparsers`` and return its parser."""
    p = subparsers.add_parser("calibrate", help="fit the simulator's compute and communication constants to measured runs")
    p.add_argument("measured", nargs="+", metavar="MEASURED", help="measured traces from `mindpipe run --out` to fit on")
    p.add_argument("--out", required=True, metavar="FILE", help="calibration JSON to write")
    p.add_argument("--holdout", nargs="+", default=[], metavar="MEASURED",
                   help="measured runs left out of the fit: report predicted vs measured before and after")
    p.add_argument("--report", default=None, metavar="DIR", help="write fidelity.md and calibration_scatter.png here")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(func=cmd_calibrate)
    return p


def format_calibration(cal: Any) -> str:
    """The fitted constants, one line each."""
    lines = []
    for name, dev in cal.devices.items():
        for precision, c in dev.compute.items():
            scales = ", ".join(f"{k} ×{v:.3g}" for k, v in c.scale.items())
            lines.append(f"compute {name} {precision} ({c.threads_per_rank} thread(s)/rank): {scales}; "
                         f"{1e6 * c.op_overhead_s:.0f} µs per op (+{1e6 * c.tp_op_overhead_s:.0f} µs tensor-parallel, "
                         f"+{1e9 * c.tp_comm_cpu_s_per_byte:.2f} ns CPU per TP byte sent); "
                         f"optimizer {1e3 * c.optimizer_overhead_s:.2f} ms + {1e9 * c.optimizer_s_per_param:.2f} ns/param; "
                         f"fit on {c.samples} action groups, MAPE {100 * c.fit_mape:.1f}%")
        shared = f"; {dev.cpus_per_node} CPUs per host shared by its ranks" if dev.cpus_per_node else ""
        if dev.host_samples:
            lines.append(f"host work {name}: {1e3 * dev.step_cpu_s:.1f} ms CPU per iteration + "
                         f"{1e6 * dev.op_cpu_s:.0f} µs per op outside the actions; fit on {dev.host_samples} ranks, "
                         f"MAPE {100 * dev.host_fit_mape:.1f}%")
        lines.append(f"step overhead {name}: {1e3 * dev.step_overhead_s:.1f} ms per iteration{shared}")
    for backend, links in cal.comm.items():
        for link, lc in links.items():
            lines.append(f"comm {backend} {link}: {1e6 * lc.step_latency_s:.1f} µs per step, "
                         f"{lc.bandwidth_Bps / 1e9:.3g} GB/s; fit on {lc.samples} collectives, MAPE {100 * lc.fit_mape:.1f}%")
            if lc.cpu_s_per_step or lc.cpu_s_per_byte:
                lines.append(f"comm {backend} {link} host copies: {1e6 * lc.cpu_s_per_step:.1f} µs CPU per step + "
                             f"{1e9 * lc.cpu_s_per_byte:.2f} ns CPU per byte, on the cores the ranks share")
    return "\n".join(lines)


def cmd_calibrate(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Fit, write, and report (see module docstring)."""
    from mindpipe.simulator.calibrate.fidelity import fidelity, scatter_png, summary, table_markdown, table_text
    from mindpipe.simulator.calibrate.fit import calibrate
    from mindpipe.simulator.calibrate.runs import load_runs
    from mindpipe.traces.calibration import save_calibration
    from mindpipe.traces.schema import to_dict

    runs = load_runs(args.measured)
    holdout = load_runs(args.holdout) if args.holdout else []
    overlap = {Path(r.source).resolve() for r in runs} & {Path(r.source).resolve() for r in holdout}
    if overlap:
        from mindpipe.traces.errors import ContractError

        raise ContractError("--holdout", None, f"{sorted(map(str, overlap))[0]} is both fitted on and held out")
    print(f"calibrating on {len(runs)} measured run(s)", file=sys.stderr, flush=True)
    cal, notes = calibrate(runs)
    save_calibration(cal, args.out)
    fitted_rows = fidelity(runs, cal)
    held_rows = fidelity(holdout, cal) if holdout else []
    report_files: list[str] = []
    if args.report:
        out = Path(args.report)
        out.mkdir(parents=True, exist_ok=True)
        md = ["# Calibration fidelity", "", f"Calibration: `{args.out}`", "", "```", format_calibration(cal), "```", "",
              "## Runs the calibration was fitted on", "", table_markdown(fitted_rows), ""]
        if held_rows:
            md += ["## Held-out runs", "", table_markdown(held_rows), ""]
        (out / "fidelity.md").write_text("\n".join(md) + "\n", encoding="utf-8")
        png = scatter_png(held_rows or fitted_rows, out / "calibration_scatter.png",
                          fitted=fitted_rows if held_rows else None)
        report_files = [str(out / "fidelity.md"), str(png)]
    if args.json:
        print(json.dumps({"calibration": to_dict(cal), "out": args.out, "fitted": summary(fitted_rows),
                          "holdout": summary(held_rows) if held_rows else None,
                          "rows": {"fitted": [vars(r) for r in fitted_rows], "holdout": [vars(r) for r in held_rows]},
                          "warnings": notes.warnings, "report": report_files}))
        return 0
    print(format_calibration(cal))
    for w in notes.warnings:
        print(f"warning: {w}")
    print("\nruns fitted on (in-sample):")
    print(table_text(fitted_rows))
    if held_rows:
        print("\nheld-out runs:")
        print(table_text(held_rows))
    print(f"\nwrote {args.out}" + "".join(f", {f}" for f in report_files))
    return 0


__all__ = ["add_parser", "cmd_calibrate", "format_calibration"]
