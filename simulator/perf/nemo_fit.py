"""Fit ``fp8_gemm_efficiency`` on the fit half of NVIDIA's NeMo H100 FP8 table, end to end.

    .venv/bin/python -m mindpipe.simulator.perf.nemo_fit --data ../shared/data/validation/nemo_2407_h100_fp8.csv [--write]

One constant, one dimension: the value in [0.30, 1.00] whose simulated iteration times
(:func:`mindpipe.simulator.perf.nemo_validate.predict_s`) have the smallest mean absolute percentage
error on the rows of :func:`~mindpipe.simulator.perf.nemo_validate.nemo_split` (seed 0, at most half
of the simulated rows), found by a 0.01 grid and a 0.001 grid around its best point. The hold-out
half is only evaluated, after the fit, for the record written beside the value. Every other
constant is the A100 family's (``a100.json``), unchanged.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from mindpipe.simulator.perf.fp8 import FP8_FILE, FP8_KEY, Fp8Constants
from mindpipe.simulator.perf.nemo import NemoRow, load_nemo
from mindpipe.simulator.perf.nemo_validate import SPLIT_SEED, nemo_split, predict_s

LO, HI = 0.30, 1.00


def mape(rows: Sequence[NemoRow], efficiency: float) -> float:
    """MAPE (percent) of ``rows`` simulated with ``fp8_gemm_efficiency = efficiency``."""
    fp8 = Fp8Constants(efficiency)
    return 100 * statistics.fmean(abs(predict_s(r, fp8) / r.measured_iteration_time_s - 1) for r in rows)


def fit_fp8_efficiency(rows: Sequence[NemoRow]) -> tuple[float, float]:
    """(efficiency, fit MAPE %) minimising the MAPE of ``rows`` (coarse then fine grid, module docstring)."""
    coarse = [round(LO + 0.01 * i, 2) for i in range(round((HI - LO) / 0.01) + 1)]
    best = min(coarse, key=lambda e: mape(rows, e))
    fine = [round(best + 0.001 * i, 3) for i in range(-10, 11) if LO <= best + 0.001 * i <= HI]
    value = min(fine, key=lambda e: mape(rows, e))
    return value, mape(rows, value)


def constants_doc(value: float, holdout_mape: float, data: str, fit_rows: Sequence[NemoRow]) -> dict:
    """The ``fp8.json`` document for a fitted value."""
    name = Path(data).name
    return {
        "format_version": 1,
        "family": "fp8",
        "description": "How FP8 GEMMs (plan precision fp8) run relative to the 16-bit GEMM model of the device's "
                       "family: the blocks' linear layers at the device's FP8 peak, with the family's tiles and "
                       "ceiling scaled by fp8_gemm_efficiency.",
        "regenerate": ".venv/bin/python -m mindpipe.simulator.perf.nemo_fit --data ../shared/data/validation/"
                      "nemo_2407_h100_fp8.csv --write",
        "constants": {FP8_KEY: {
            "value": value,
            "unit": "fraction of the 16-bit GEMM ceiling reached at the FP8 peak",
            "method": "fit",
            "source": "end to end through simulate() (simulator/perf/nemo_fit.py): grid search minimising the MAPE "
                      "of the derived iteration times of the fit rows",
            "note": "absorbs what the kernel model does not list about FP8 GEMMs (TE's amax reductions, scaling "
                    "updates, FP8 GEMM tile efficiencies, the SMs TE's userbuffers take from the GEMMs); NeMo's TP "
                    "overlap, overlapped parameter all-gather and recompute are in the rows' plans "
                    "(simulator/perf/nemo.py recipes), not in this constant",
            "fit_files": [f"validation/{name}: " + ", ".join(f"{r.name} (line {r.source.rsplit(':', 1)[1]})"
                                                             for r in fit_rows)
                          + f" = nemo_split(seed={SPLIT_SEED})"],
            "holdout_files": [f"validation/{name}: the other rows (the context-parallel ones among them)"],
            "holdout_mape_percent": round(holdout_mape, 2),
        }},
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Fit, print fit and hold-out MAPE, and with ``--write`` replace the shipped ``fp8.json``."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True, help="nemo_2407_h100_fp8.csv")
    ap.add_argument("--write", action="store_true", help="write simulator/perf/data/fp8.json")
    args = ap.parse_args(argv)
    rows = load_nemo(args.data)
    fit, holdout = nemo_split(rows)
    value, fit_mape = fit_fp8_efficiency(fit)
    holdout_mape = mape(holdout, value)
    print(f"{FP8_KEY} = {value}: fit MAPE {fit_mape:.2f}% ({len(fit)} rows), hold-out MAPE {holdout_mape:.2f}% "
          f"({len(holdout)} rows)")
    if args.write:
        out = Path(__file__).resolve().parent / "data" / FP8_FILE
        out.write_text(json.dumps(constants_doc(value, holdout_mape, args.data, fit), indent=2) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
