"""``mindpipe calibrate``: fit the simulator's constants to measured runs (torch-free).

    mindpipe calibrate m1.json m2.json ... --out calibration.json [--holdout h1.json ...] [--report DIR]
        [--trace SUPERNET_TRACE ...]

Reads measured traces written by ``mindpipe run``, fits compute, communication, host CPU and step
overhead (:mod:`mindpipe.simulator.calibrate.fit`), writes the calibration file and prints what was
fitted and how well it explains the runs it came from. With ``--holdout``, runs *not* used in the
fit are predicted before and after calibration (the fidelity report); ``--report DIR`` also writes
that table as Markdown and the scatter plot as PNG
(:func:`~mindpipe.simulator.calibrate.fidelity.fidelity_report`). Supernet runs are fitted by
:mod:`mindpipe.simulator.calibrate.supernet`; ``--trace`` gives it per-candidate profiles to fit
``trace_scale`` against (and the report then predicts with them). ``--json`` prints one object on
stdout.

What the fit cannot vouch for is printed as warnings (and written into ``fidelity.md``): constants
no run identifies, operator kinds no run exercised (their scale stays the uncalibrated 1.0), and
held-out runs of another model than the one fitted on (predicted, but their error is the
calibration's transfer to that model). The calibration file holds no creation time: a refit of
the same runs writes the same bytes.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from mindpipe.cli.output import check_outputs, print_json, stderr
from mindpipe.traces.errors import ContractError
from mindpipe.traces.units import plural


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``calibrate`` subcommand to ``sub`` and return its parser."""
    p = sub.add_parser("calibrate", help="fit the simulator's compute and communication constants to measured runs")
    p.add_argument("measured", nargs="+", metavar="MEASURED", help="measured traces from `mindpipe run --out` to fit on")
    p.add_argument("--out", required=True, metavar="FILE", help="calibration JSON to write")
    p.add_argument("--holdout", nargs="+", default=[], metavar="MEASURED",
                   help="measured runs left out of the fit: report predicted vs measured before and after")
    p.add_argument("--report", default=None, metavar="DIR", help="write fidelity.md and calibration_scatter.png here")
    p.add_argument("--trace", nargs="+", default=[], metavar="TRACE",
                   help="supernet runs: per-candidate traces (mindpipe profile SUPERNET) to fit trace_scale against; "
                        "a simulation given the trace and this calibration then prices candidates as trace × it")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(func=cmd_calibrate)
    return p


def cmd_calibrate(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Fit, write, and report (see module docstring)."""
    from mindpipe.simulator.calibrate.fidelity import fidelity, format_calibration
    from mindpipe.simulator.calibrate.fit import calibrate, check_one_model, held_out_model_warnings
    from mindpipe.simulator.calibrate.runs import MeasuredRun, check_distinct
    from mindpipe.simulator.calibrate.supernet import SupernetRun, load_measured
    from mindpipe.traces.calibration import save_calibration

    check_outputs([args.out], [args.report], inputs=[*args.measured, *args.holdout, *(args.trace or [])])
    twice = next((b for i, a in enumerate(args.measured) for b in args.measured[i + 1:]
                  if os.path.isfile(a) and os.path.isfile(b) and os.path.samefile(a, b)), None)
    if twice is not None:
        raise ContractError(twice, None, "is given twice: each measured run counts once in the fit")
    runs, nets = load_measured(args.measured)
    holdout, held_nets = load_measured(args.holdout) if args.holdout else ([], [])
    fitted_on: list[MeasuredRun | SupernetRun] = [*runs, *nets]
    held_out: list[MeasuredRun | SupernetRun] = [*holdout, *held_nets]
    if (nets and holdout) or (runs and held_nets):
        raise ContractError("--holdout", None, "the held-out runs must be of the kind fitted on (GPT or supernet runs)")
    check_one_model(runs)  # before the progress line: a refusal is the only line on stderr
    check_distinct(fitted_on, held_out)  # a copied file is the same run: counted twice, or held out and fitted on
    if nets:
        return _calibrate_supernet(args, nets, held_nets)
    if args.trace:
        raise ContractError("--trace", None, "applies to supernet runs only (GPT runs are fitted on the operator model)")
    stderr(f"calibrating on {plural(len(runs), 'measured run')}")
    cal, notes = calibrate(runs)
    save_calibration(cal, args.out)
    fitted_rows = fidelity(runs, cal)
    held_rows = fidelity(holdout, cal) if holdout else []
    warnings = [*notes.warnings, *held_out_model_warnings(runs, holdout)]
    return _report(args, cal, warnings, format_calibration(cal), fitted_rows, held_rows, "Calibration fidelity")


def _calibrate_supernet(args: argparse.Namespace, runs: list[Any], holdout: list[Any]) -> int:
    """The supernet branch: fit :mod:`mindpipe.simulator.calibrate.supernet`, report time per subnet."""
    from mindpipe.cli import loaders
    from mindpipe.simulator.calibrate.fidelity import format_calibration
    from mindpipe.simulator.calibrate.supernet import calibrate_supernet, check_profiles, supernet_fidelity
    from mindpipe.traces.calibration import save_calibration

    traces = [loaders.trace(t) for t in args.trace]
    check_profiles(traces, runs)  # before the progress line: a refusal is the only line on stderr
    stderr(f"calibrating the supernet simulator on {plural(len(runs), 'measured supernet run')}"
           + (f" against {plural(len(traces), 'per-candidate trace')}" if traces else ""))
    cal, notes = calibrate_supernet(runs, traces)
    save_calibration(cal, args.out)
    fitted_rows = supernet_fidelity(runs, cal, traces)
    held_rows = supernet_fidelity(holdout, cal, traces) if holdout else []
    constants = format_calibration(cal).replace("per iteration", "per subnet and stage outside the actions")
    return _report(args, cal, notes.warnings, constants, fitted_rows, held_rows,
                   "Supernet calibration fidelity (seconds per subnet)",
                   "times are seconds per subnet (3600 / subnets per hour)\n")


def _report(args: argparse.Namespace, cal: Any, warnings: list[str], constants: str, fitted_rows: list[Any],
            held_rows: list[Any], title: str, note: str = "") -> int:
    """Print (or ``--json``) the fitted constants and the fidelity table, write the report files."""
    from mindpipe.simulator.calibrate.fidelity import fidelity_report, summary
    from mindpipe.traces.schema import to_dict

    if not args.json:
        print(constants)
        for w in warnings:
            print(f"warning: {w}")
        print(f"\n{note}" if note else "")
    files = [str(f) for f in fidelity_report(
        held_rows, fitted_rows, report_dir=args.report, title=title,
        preface=[f"Calibration: `{args.out}`", "", "```", constants, "```", "",
                 *[f"- warning: {w}" for w in warnings], *([""] if warnings else [])],
        print_to=None if args.json else sys.stdout)]
    if args.json:
        print_json({"calibration": to_dict(cal), "out": args.out, "fitted": summary(fitted_rows).to_dict(),
                    "holdout": summary(held_rows).to_dict() if held_rows else None,
                    "rows": {"fitted": [vars(r) for r in fitted_rows], "holdout": [vars(r) for r in held_rows]},
                    "warnings": warnings, "report": files})
    else:
        print(f"\nwrote {args.out}" + "".join(f", {f}" for f in files))
    return 0


__all__ = ["add_parser", "cmd_calibrate"]
