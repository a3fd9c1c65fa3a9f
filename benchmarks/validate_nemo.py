"""The FP8 H100 model against NVIDIA's NeMo 24.07 DGX-H100 pre-training table (issue 19).

Simulates every row (``mindpipe validate nemo-h100`` does the same)
with the shipped ``fp8_gemm_efficiency`` and reports MAPE and max error on all of them, on the
seed-0 fit half (the rows the constant was fitted on, ``simulator/perf/nemo_fit.py``) and on the
hold-out half, and per model. It then re-runs the fit on the fit half to show the shipped value is
what the fit gives, and, for reference only (nothing is chosen from it), the hold-out error with
the constant's prior (0.70) and with FP8 GEMMs at the bf16 GEMM efficiency (1.0). The two
context-parallel rows (the plan's ``cp``) are in the hold-out half. Acceptance (issue 19): hold-out MAPE ≤ 8 %
(Echo reports 8 % on H800). Writes ``benchmarks/results/validate_nemo.json``.

Which mechanism moved which rows (``mechanisms``): every row's signed error with each mechanism
of NeMo's recipe (:data:`~mindpipe.simulator.perf.nemo_validate.MECHANISMS`) switched off alone at
the shipped constant, and the model with all of them off re-fitted on the same fit half (the
model before them: charging TP collectives and the parameter all-gather in full, no recompute).
Peak memory per row is the simulator's (FlashAttention's softmax statistics, not a·s²·b).

    .venv/bin/python benchmarks/validate_nemo.py [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from mindpipe.simulator.perf.fp8 import FP8_KEY, shipped_fp8_constants
from mindpipe.simulator.perf.gpu import GpuComputeModel
from mindpipe.simulator.perf.nemo import load_nemo
from mindpipe.simulator.perf.nemo_fit import fit_fp8_efficiency, mape
from mindpipe.simulator.perf.nemo_validate import (
    ECHO_PUBLISHED_ERROR_PCT,
    MECHANISMS,
    nemo_report,
    nemo_split,
    pct_errors,
    simulate_row,
    without,
)
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.catalog import get_device

TARGET_HOLDOUT_MAPE = 8.0
REFERENCE_EFFICIENCIES = {"prior": 0.70, "bf16_efficiency": 1.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "validate_nemo.json"))
    args = ap.parse_args()
    rows = load_nemo(Path(args.data) / "validation" / "nemo_2407_h100_fp8.csv")
    t0 = time.perf_counter()
    report = nemo_report(rows).to_dict()
    wall = time.perf_counter() - t0
    fit, holdout = nemo_split(rows)
    refit, refit_mape = fit_fp8_efficiency(fit)
    shipped = shipped_fp8_constants().gemm_efficiency
    hold = report["holdout_half"]["mape"]
    out = {
        "dataset": "nemo-h100", "gpu": "h100-sxm5-80gb", "precision": "fp8", "simulate_wall_s": wall,
        FP8_KEY: {"shipped": shipped, "refit_on_fit_half": refit, "refit_fit_mape": refit_mape,
                  "matches_shipped": abs(refit - shipped) < 1e-9},
        "holdout_mape_with_reference_efficiencies": {k: mape(holdout, v) for k, v in REFERENCE_EFFICIENCIES.items()},
        "target_holdout_mape": TARGET_HOLDOUT_MAPE, "meets_target": hold <= TARGET_HOLDOUT_MAPE,
        "echo_published_error_pct": ECHO_PUBLISHED_ERROR_PCT,
        **report,
    }
    shipped_err = pct_errors(rows)
    off_one = {m: pct_errors(rows, off=[m]) for m in MECHANISMS}
    bare_fit = [without(r, *MECHANISMS) for r in fit]
    bare_eff, bare_fit_mape = fit_fp8_efficiency(bare_fit)
    bare_hold = mape([without(r, *MECHANISMS) for r in holdout], bare_eff)
    out["mechanisms"] = {
        "switched_off_alone_at_shipped_constant": {
            m: {"fit_mape": _mape(errs, fit), "holdout_mape": _mape(errs, holdout), "pct_error": errs}
            for m, errs in off_one.items()},
        "all_off_refit": {"fp8_gemm_efficiency": bare_eff, "fit_mape": bare_fit_mape, "holdout_mape": bare_hold},
        "shipped_pct_error": shipped_err,
    }
    for r in out["rows"]:
        row = next(x for x in rows if x.source == r["source"])
        res = simulate_row(row)
        r["peak_memory_gib"] = res.peak_memory_gib
        r["fits_in_memory"] = res.fits_in_memory
        # What the memory model said before it followed FlashAttention (a·s²·b scores kept).
        unfused = Simulator(row.model, row.cluster, compute=GpuComputeModel(get_device(row.cluster.gpu)))
        # (Context parallelism runs in the fused kernel only: no such plan for a cp row.)
        scores_kept = dataclasses.replace(row.plan, flash_attention=False) if row.cp == 1 else None
        r["peak_memory_gib_if_scores_kept"] = (max(m.total_gib for m in unfused.memory(scores_kept))
                                               if scores_kept is not None else None)
    print(f"nemo-h100: {report['n']} rows simulated in {wall:.1f} s ({sum(r.cp > 1 for r in rows)} with context "
          "parallelism): "
          f"MAPE {report['mape']:.2f}% (fit half {report['fit_half']['mape']:.2f}%, hold-out half {hold:.2f}%), max "
          f"{report['max_abs_pct_error']:.1f}%; target hold-out <= {TARGET_HOLDOUT_MAPE}%: "
          f"{'met' if out['meets_target'] else 'NOT met'}")
    print(f"{FP8_KEY}: shipped {shipped}, re-fit {refit} (fit MAPE {refit_mape:.2f}%); hold-out at the prior 0.70: "
          f"{out['holdout_mape_with_reference_efficiencies']['prior']:.2f}%, at 1.0: "
          f"{out['holdout_mape_with_reference_efficiencies']['bf16_efficiency']:.2f}%")
    print(f"all mechanisms off, re-fit on the fit half: {FP8_KEY} {bare_eff}, fit MAPE {bare_fit_mape:.2f}%, hold-out "
          f"MAPE {bare_hold:.2f}%")
    names = list(MECHANISMS)
    print(f"  {'row':<26} {'half':<8} {'error':>7}  " + "  ".join(f"{'w/o ' + m:>24}" for m in names) + "  peak GiB (scores kept)")
    for r in out["rows"]:
        src = r["source"]
        kept = r["peak_memory_gib_if_scores_kept"]
        mesh = f"{r['model']} tp{r['tp']} pp{r['pp']}" + (f" cp{r['cp']}" if r["cp"] > 1 else "") + f" dp{r['dp']}"
        print(f"  {mesh:<26} {r['half']:<8} "
              f"{r['pct_error']:+6.1f}%  " + "  ".join(f"{off_one[m][src]:+23.1f}%" for m in names)
              + f"  {r['peak_memory_gib']:8.1f} ({'-' if kept is None else format(kept, '.1f')})")
    print("  " + " " * 44 + "  ".join(
        f"{'fit ' + format(_mape(off_one[m], fit), '.2f') + ' / hold ' + format(_mape(off_one[m], holdout), '.2f'):>24}"
        for m in names))
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


def _mape(errs: dict[str, float], rows: list) -> float:
    return sum(abs(errs[r.source]) for r in rows) / len(rows)


if __name__ == "__main__":
    main()
