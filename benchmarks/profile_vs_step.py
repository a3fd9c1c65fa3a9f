"""Does the per-layer profile account for a whole training step? (issue 2 acceptance)

Profiles ``gpt-mini`` on this machine (layer and operator granularity) and compares the sum of
per-layer forward + backward (B + W) medians with a whole forward + loss + backward step of the
same model and batch, timed separately in the same process. Prints a table and writes
``benchmarks/results/profile_vs_step.json``.

    .venv/bin/python benchmarks/profile_vs_step.py [--model gpt-mini] [--micro-batch-size 4] [--trials 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from mindpipe.traces.builtin import load_model
from mindpipe.traces.profiler import ProfileOptions, profile_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-mini")
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "profile_vs_step.json"))
    args = ap.parse_args()
    model = load_model(args.model)
    rows = []
    for granularity in ("layer", "op"):
        for trial in range(args.trials):
            opts = ProfileOptions(micro_batch_size=args.micro_batch_size, granularity=granularity, seed=trial)
            trace = profile_model(model, opts, command="benchmarks/profile_vs_step.py")
            step = trace.step.forward_backward_s if trace.step else float("nan")
            rows.append(
                {
                    "granularity": granularity,
                    "trial": trial,
                    "records": len(trace.layers),
                    "per_layer_sum_s": trace.forward_backward_s,
                    "step_s": step,
                    "ratio": trace.forward_backward_s / step,
                }
            )
            r = rows[-1]
            print(
                f"{granularity:5s} trial {trial}: {r['records']:3d} records, per-layer sum {r['per_layer_sum_s'] * 1e3:8.2f} ms, "
                f"whole step {r['step_s'] * 1e3:8.2f} ms, ratio {r['ratio']:.3f}",
                flush=True,
            )
    summary = {
        g: statistics.median(r["ratio"] for r in rows if r["granularity"] == g) for g in ("layer", "op")
    }
    result = {
        "model": args.model,
        "micro_batch_size": args.micro_batch_size,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "median_ratio": summary,
        "max_abs_deviation": max(abs(r["ratio"] - 1) for r in rows),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))


if __name__ == "__main__":
    main()
