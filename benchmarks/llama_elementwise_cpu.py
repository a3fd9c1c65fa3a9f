"""Does pricing a Llama block's element-wise operators as the executor's eager kernels predict its runs better?

The simulator prices a Llama block's RMSNorms, rotary embedding and SwiGLU either as the
executor's eager PyTorch kernels (a plan's default ``fused_elementwise=false``,
:func:`mindpipe.simulator.ops.rms_norm_ops`) or as one fused kernel each (``true``, Transformer
Engine's). On a GPU only a GPU run can tell; on this CPU the executor runs the same eager code, and
the CPU model prices the same operator list, so a measurement here checks the kernel-by-kernel
accounting itself.

The check: the five ``gpt-mini`` fit plans of ``benchmarks/calibration_fidelity.py`` and two plans of
``llama-mini`` (a Llama block of gpt-mini's size: 4 layers, h 256, 8 heads over 4 K/V heads, SwiGLU
width 704, s 128, fp32) run on this machine (``mindpipe run``, gloo, 10 steps, 2 warm-up), in
``--rounds`` rounds (the plans in turn, then again; this VM drifts between minutes). The
calibration is fitted on the GPT runs only (``mindpipe calibrate``'s fit), so the Llama runs are
held out twice over: plans and model. Each Llama plan is then predicted with the calibration
under both settings of ``fused_elementwise`` and compared with its measured median.

Run: ``.venv/bin/python benchmarks/llama_elementwise_cpu.py`` fits and predicts on the stored runs
(seconds); ``--rerun [--rounds 2]`` measures them again (about 4 minutes on two cores, nothing else
running) into ``benchmarks/results/llama_elementwise_cpu/`` (gzip-compressed measured traces).
Writes ``benchmarks/results/llama_elementwise_cpu.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mindpipe.simulator.api import SimulationOptions, simulate
from mindpipe.simulator.calibrate.fit import calibrate
from mindpipe.simulator.calibrate.runs import load_runs
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.schema import to_dict

from mindpipe.runs import run_plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration_fidelity import FIT, SPEC

RESULTS = Path(__file__).resolve().parent / "results"
RUNS_DIR = RESULTS / "llama_elementwise_cpu"
LLAMA_MINI = Model(kind="llama", num_layers=4, hidden_size=256, num_heads=8, num_kv_heads=4, ffn_hidden_size=704,
                   seq_len=128, vocab_size=2048, name="llama-mini")
LLAMA_PLANS = {
    "llama_dp2": Plan(dp=2, micro_batch_size=8, global_batch_size=32, precision="fp32"),
    "llama_pp2_1f1b": Plan(pp=2, micro_batch_size=4, global_batch_size=32, precision="fp32"),
}


def measure(rounds: int) -> None:
    """Run the seven plans round after round; store each measured trace gzip-compressed."""
    RUNS_DIR.mkdir(parents=True, exist_ok=True)
    for old in RUNS_DIR.glob("*.json.gz"):
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(rounds):
            for name, plan in [*FIT.items(), *LLAMA_PLANS.items()]:
                model: Model | str = LLAMA_MINI if name in LLAMA_PLANS else "gpt-mini"
                out = Path(tmp) / f"{name}.json"
                print(f"round {rnd}: {name}", file=sys.stderr, flush=True)
                run_plan(plan, model, out, SPEC, log=lambda m: print(m, file=sys.stderr, flush=True))
                with out.open("rb") as src, gzip.open(RUNS_DIR / f"{name}.r{rnd}.json.gz", "wb") as dst:
                    shutil.copyfileobj(src, dst)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rerun", action="store_true", help="measure the seven plans again (replaces the stored runs)")
    ap.add_argument("--rounds", type=int, default=2, help="with --rerun: rounds over the seven plans (default 2)")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    if args.rerun:
        measure(args.rounds)
    fit_runs = load_runs([p for name in FIT for p in sorted(RUNS_DIR.glob(f"{name}.r*.json.gz"))])
    cal, _ = calibrate(fit_runs)
    rows = []
    for name in LLAMA_PLANS:
        runs = load_runs(sorted(RUNS_DIR.glob(f"{name}.r*.json.gz")))
        measured = statistics.median(r.iteration_s for r in runs)
        run = runs[0]
        row = {"plan": name, "measured_s": measured, "measured_by_round_s": [r.iteration_s for r in runs]}
        for fused in (False, True):
            plan = dataclasses.replace(run.plan, fused_elementwise=fused)
            pred = simulate(run.model, run.cluster, plan, SimulationOptions(calibration=cal)).iteration_time_s
            key = "fused" if fused else "eager"
            row[f"predicted_{key}_s"], row[f"error_{key}"] = pred, pred / measured - 1
        rows.append(row)
        print(f"{name:16s} measured {measured:.3f} s (rounds {', '.join(f'{r.iteration_s:.3f}' for r in runs)}); "
              f"predicted eager {row['predicted_eager_s']:.3f} s ({row['error_eager']:+.1%}), "
              f"fused {row['predicted_fused_s']:.3f} s ({row['error_fused']:+.1%})")
    mape = {k: 100 * statistics.mean(abs(r[f"error_{k}"]) for r in rows) for k in ("eager", "fused")}
    print(f"Llama runs held out, calibrated on the GPT fit plans: MAPE eager {mape['eager']:.1f} %, "
          f"fused {mape['fused']:.1f} % ({time.perf_counter() - start:.0f} s)")
    out = {"command": ".venv/bin/python benchmarks/llama_elementwise_cpu.py" + (" --rerun" if args.rerun else ""),
           "model": to_dict(LLAMA_MINI), "fit_plans": {n: to_dict(p) for n, p in FIT.items()},
           "llama_plans": {n: to_dict(p) for n, p in LLAMA_PLANS.items()}, "calibration": to_dict(cal),
           "rows": rows, "mape_pct": mape, "wall_s": time.perf_counter() - start}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "llama_elementwise_cpu.json").write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
