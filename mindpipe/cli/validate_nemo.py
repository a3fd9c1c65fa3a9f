"""``mindpipe validate nemo-h100``: the FP8 H100 model against NVIDIA's NeMo 24.07 table (torch-free).

    mindpipe validate nemo-h100 --data nemo_2407_h100_fp8.csv [--json]

Every row is simulated on ``h100-sxm5-80gb`` at precision ``fp8`` (:mod:`mindpipe.simulator.perf.nemo`,
:mod:`mindpipe.simulator.perf.nemo_validate`); the context-parallel rows with the plan's ``cp``, in the
hold-out half. ``--json`` prints one object (``mape``, the fit and hold-out halves, per-model error,
per-row results).
``--gpu``, ``--sample``, ``--calibration`` and ``--report`` belong to the other datasets and are
refused here with one line.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mindpipe.cli import loaders
from mindpipe.cli.output import print_json
from mindpipe.traces.errors import ContractError

if TYPE_CHECKING:
    from mindpipe.simulator.perf.nemo_validate import NemoReport

DATASET = "nemo-h100"


def _refuse_other_options(args: argparse.Namespace, argv: Sequence[str]) -> None:
    for flag, given in (("--gpu", any(a == "--gpu" or a.startswith("--gpu=") for a in argv)),
                        ("--sample", args.sample is not None), ("--calibration", args.calibration is not None),
                        ("--report", args.report is not None)):
        if given:
            raise ContractError(flag, None, f"{flag} does not apply to {DATASET} (its runs are DGX-H100, FP8)")
    if len(args.data) != 1:
        raise ContractError("--data", None, f"{DATASET} takes one CSV file, got {len(args.data)}")


def format_nemo(report: NemoReport) -> str:
    """Human-readable table: one line per row, both halves, the error per model and per layout."""
    from mindpipe.simulator.perf.accuracy import error_table_lines
    from mindpipe.simulator.perf.nemo_validate import ECHO_PUBLISHED_ERROR_PCT

    lines = [f"{'row':<30} {'model':<14} {'gpus':>4} {'tp':>3} {'pp':>3} {'cp':>3} {'dp':>3} {'mb':>3} {'gbs':>5} "
             f"{'half':<8} {'measured s':>10} {'predicted s':>11} {'error':>8}"]
    for row in report.rows:
        r = row.result
        lines.append(f"{Path(r.source).name:<30} {r.size:<14} {r.gpus:>4} {r.tp:>3} {r.pp:>3} "
                     f"{row.cp:>3} {r.dp:>3} {r.micro_batch:>3} {r.global_batch:>5} {row.half:<8} "
                     f"{r.measured_s:>10.3f} {r.predicted_s:>11.3f} {100 * r.error:>+7.1f}%")
    s = report.summary
    lines.append("")
    lines.append(f"{DATASET}: {s.overall.n} rows simulated, MAPE {s.overall.mape:.2f}%, max |error| "
                 f"{s.overall.max_abs_pct_error:.1f}%, median signed {s.overall.median_signed_pct_error:+.1f}%")
    for name, h in (("fit half", s.fit_half), ("holdout half", s.holdout_half)):
        if h is None or not h.n:
            lines.append(f"  {name:<13}   0 rows")
            continue
        lines.append(f"  {name:<13} {h.n:>3} rows, MAPE {h.mape:.2f}%, max {h.max_abs_pct_error:.1f}%")
    lines.append(f"  Echo's published error (GPT-175B, 96 H800): {ECHO_PUBLISHED_ERROR_PCT:.0f}%")
    for title, table in (("model", s.by_model_size), ("layout", s.by_layout)):
        lines += error_table_lines(title, table, 14, median=False)
    return "\n".join(lines)


def validate_nemo_h100(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Simulate the table's rows and print predicted vs measured (or one JSON object with ``--json``)."""
    from mindpipe.simulator.perf.nemo_validate import nemo_report

    _refuse_other_options(args, argv)
    data = args.data[0]
    report = nemo_report(loaders.nemo_rows(data))
    if not report.summary.overall.n:
        raise ContractError(data, None, "the table has no rows")
    if args.json:
        print_json({"dataset": DATASET, "data": data, "gpu": "h100-sxm5-80gb", "precision": "fp8", **report.to_dict()})
    else:
        print(format_nemo(report))
    return 0


__all__ = ["DATASET", "format_nemo", "validate_nemo_h100"]
