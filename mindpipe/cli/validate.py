"""``mindpipe validate``: the simulator against measurements — published ones, or your own runs (torch-free).

    mindpipe validate vtrain-single --data vtrain_a100_single_node.csv [--json]
    mindpipe validate vtrain-multi  --data vtrain_a100_multi_node.csv  [--gpu h100-sxm5-80gb]
    mindpipe validate measured --data m1.json m2.json ... [--calibration cal.json] [--report DIR]
    mindpipe validate nemo-h100 --data nemo_2407_h100_fp8.csv [--json]

``nemo-h100`` simulates NVIDIA's NeMo 24.07 DGX-H100 FP8 table on ``h100-sxm5-80gb`` at plan
precision ``fp8`` (:mod:`mindpipe.cli.validate_nemo`).

``measured`` takes traces written by ``mindpipe run`` and prints predicted vs measured iteration
time, uncalibrated and (with ``--calibration``) calibrated; ``--report DIR`` also writes the
table as Markdown and the scatter plot
(:func:`~mindpipe.simulator.calibrate.fidelity.fidelity_report`). ``--calibration`` applies to
the vTrain datasets too (a calibration fitted on GPU runs of that device).

The datasets are not shipped (DESIGN.md: the product must not need them); the user points at
the CSV. ``--json`` prints one object on stdout (``mape``, ``max_abs_pct_error``, ``n``, per-row
results, error by model size, the fit/hold-out halves, and ``ranking``: per group of plans of one
model on the same GPUs at the same global batch, Spearman's ρ between predicted and measured
times and the regret of the predicted-best plan, with ``ranking_summary`` across groups); progress
goes to stderr. Bad input raises
:class:`~mindpipe.traces.errors.ContractError`, which the CLI turns into one line and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mindpipe.cli import loaders
from mindpipe.cli.args import count, seed
from mindpipe.cli.output import check_outputs, print_json
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import limit

if TYPE_CHECKING:
    from mindpipe.traces.calibration import Calibration

DATASETS = ("vtrain-single", "vtrain-multi", "measured", "nemo-h100")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``validate`` subcommand to ``sub`` and return its parser."""
    p = sub.add_parser("validate", help="simulate published runs and print the error of the performance model")
    p.add_argument("dataset", choices=DATASETS, help="which measurements --data holds")
    p.add_argument("--data", required=True, nargs="+", metavar="FILE",
                   help="the dataset's CSV (vTrain ground_truth_{single,multi}.csv, or NeMo's nemo_2407_h100_fp8.csv for "
                        "nemo-h100), or measured traces for 'measured'")
    p.add_argument("--calibration", default=None, metavar="FILE", help="simulate with this calibration (mindpipe calibrate)")
    p.add_argument("--report", default=None, metavar="DIR", help="measured: write fidelity.md and calibration_scatter.png")
    p.add_argument("--gpu", default="a100-sxm4-80gb", help="catalog GPU to simulate the runs on (default a100-sxm4-80gb)")
    p.add_argument("--sample", type=count(1, int(limit("vtrain_rows"))), default=None, metavar="N",
                   help="validate N rows drawn with --seed (default all)")
    p.add_argument("--seed", type=seed(), default=0, help="seed of --sample and of the fit/hold-out split (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_validate)
    return p


def cmd_validate(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Simulate every (or a sample of the) row(s) and print predicted vs measured."""
    check_outputs(dirs=[args.report])
    calibration = loaders.calibration(args.calibration)
    if args.dataset == "measured":
        return _validate_measured(args, calibration)
    if args.dataset == "nemo-h100":
        from mindpipe.cli.validate_nemo import validate_nemo_h100

        return validate_nemo_h100(args, argv)
    return _validate_vtrain(args, calibration)


def _validate_vtrain(args: argparse.Namespace, calibration: Calibration | None) -> int:
    """vTrain's published runs: per-row error, MAPE, error by model size."""
    import random

    from mindpipe.simulator.perf.validate import format_report, summarize, validate_rows, with_gpu
    from mindpipe.simulator.perf.vtrain import split_fit_holdout
    from mindpipe.traces.catalog import get_device

    if len(args.data) != 1:
        raise ContractError("--data", None, f"{args.dataset} takes one CSV file, got {len(args.data)}")
    if args.report is not None:
        raise ContractError("--report", None, f"--report writes the fidelity report of 'measured' runs; {args.dataset} "
                                              "prints its tables (--json gives every row)")
    data = args.data[0]
    try:
        device = get_device(args.gpu)
    except ContractError as e:
        raise ContractError("--gpu", None, e.rule) from None
    if device.kind != "gpu":
        raise ContractError("--gpu", "gpu", f"{args.gpu} is not a GPU; validate compares GPU runs")
    rows = loaders.vtrain_rows(data, args.dataset)
    # The split of the shipped fit (simulator/perf/refit.py): rows a constant may have been fitted on.
    fit, _ = split_fit_holdout(rows, seed=0)
    fit_sources = {r.source for r in fit} if args.dataset == "vtrain-single" else None
    if args.sample is not None:
        if args.sample <= 0:
            raise ContractError("--sample", "sample", f"--sample={args.sample} must be > 0")
        rows = random.Random(args.seed).sample(rows, min(args.sample, len(rows)))
    rows = [with_gpu(r, device.name) for r in rows]
    total = len(rows)

    redraw = sys.stderr.isatty()  # a terminal redraws one line; a log gets one line per 50 rows

    def progress(i: int) -> None:
        if not args.quiet and (i % 50 == 0 or i == total):
            end = "\n" if i == total or not redraw else ""
            print(f"\rsimulated {i}/{total} rows" if redraw else f"simulated {i}/{total} rows", end=end,
                  file=sys.stderr, flush=True)

    results = validate_rows(rows, progress=progress, calibration=calibration)
    summary = summarize(results, fit_sources)
    if args.json:
        out = {"dataset": args.dataset, "data": data, "gpu": device.name, **summary.to_dict(),
               "fit_split": "split_fit_holdout(seed=0, fit_fraction=0.5) of vtrain-single; nothing fitted on vtrain-multi",
               "rows": [{"source": r.source, "size": r.size, "gpus": r.gpus, "tp": r.tp, "pp": r.pp, "dp": r.dp,
                         "micro_batch": r.micro_batch, "global_batch": r.global_batch, "measured_s": r.measured_s,
                         "predicted_s": r.predicted_s, "pct_error": 100 * r.error} for r in results]}
        print_json(out)
    else:
        label = args.dataset if device.name.startswith("a100") else f"{args.dataset} on {device.name}"
        print(format_report(label, results, summary))
    return 0


def _validate_measured(args: argparse.Namespace, calibration: Calibration | None) -> int:
    """Predicted vs measured for runs of ``mindpipe run`` (before and, if given, after calibration)."""
    from mindpipe.simulator.calibrate.fidelity import fidelity, fidelity_report, summary

    rows = fidelity(loaders.measured_runs(args.data), calibration)
    source = f"calibration `{args.calibration}`" if args.calibration else "no calibration"
    files = [str(f) for f in fidelity_report(rows, report_dir=args.report, title=f"Predicted vs measured ({source})",
                                             print_to=None if args.json else sys.stdout)]
    if args.json:
        print_json({"dataset": "measured", "data": list(args.data), "calibration": args.calibration,
                    **summary(rows).to_dict(), "rows": [vars(r) for r in rows], "report": files})
    elif files:
        print("wrote " + ", ".join(files))
    return 0


__all__ = ["DATASETS", "add_parser", "cmd_validate"]
