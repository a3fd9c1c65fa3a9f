"""Balanced vs even partition where the first and last stages carry a large embedding and LM head.

Issue 6's acceptance: on a model with a 50k vocabulary and few layers, the ``balanced``
partitioner (min-max over the per-layer costs, embedding on the first stage, final norm and LM
head on the last) improves the *simulated* iteration time by ≥ 15 % over ``even``, and the
executor, running both plans on CPU, confirms the direction.

The model: 8 blocks, hidden 512, 8 heads, sequence 64, vocabulary 50,257 — the LM head's
2·h·V FLOPs per token equal ~8 blocks' 24·h² (Narayanan et al., SC'21), so ``even`` [4, 4] leaves
the last stage with about 12 blocks' worth of work and the first with 4. Two pipeline stages on
``cpu:1x2``, 1F1B, 16 micro-batches of 1, fp32, no recompute.

Steps: (1) ``mindpipe tune`` over the partitioner alone (``--partitioner even,pipedream,balanced``, every
other key pinned, grid) picks the plan and writes its partition into ``best_plan.json``; (2) both
plans are simulated (PipeDream's too, for reference); (3) ``mindpipe run PLAN --nproc 2`` trains the
even plan and the tuner's ``best_plan.json`` on CPU with gloo, in alternating rounds (even,
balanced, even, balanced …) so that load from other processes on the machine falls on both alike,
and the median per-step time of each is compared.

Run from the repository root (~3 min on 2 cores)::

    .venv/bin/python benchmarks/tune_partition_balance.py

Writes ``benchmarks/results/tune_partition_balance.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mindpipe.simulator.api import simulate
from mindpipe.traces.builtin import load_cluster
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.schema import to_dict
from mindpipe.tuner.api import tune
from mindpipe.tuner.sweep import SweepConfig

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results" / "tune_partition_balance.json"
MODEL = Model(kind="gpt", num_layers=8, hidden_size=512, num_heads=8, seq_len=64, vocab_size=50257,
              name="wide-vocab-8x512")
CLUSTER = "cpu:1x2"
FIXES = ["dp=1", "tp=1", "pp=2", "micro_batch_size=1", "global_batch_size=16", "schedule=1f1b", "virtual_stages=1",
         "recompute=none", "sequence_parallel=false", "zero_stage=0", "comm_priority=fair", "precision=fp32"]


def tuned_plans(work: Path) -> tuple[dict[str, Plan], dict[str, Any]]:
    """Run the tuner over the partitioner dimension; the plans it evaluated and its summary."""
    outcome = tune(MODEL, CLUSTER, out=work / "tune", global_batch=16, fixes=FIXES,
                   partitioners=["even", "pipedream", "balanced"],
                   config=SweepConfig(optimizer="grid", budget=3, workers=1), plots=False)
    plans = {r.point["partitioner"]: r.plan for r in outcome.result.records if r.plan is not None}
    return plans, outcome.summary.to_dict()


def run_plan(plan_path: Path, model_path: Path, steps: int, out: Path) -> list[float]:
    """Per-step wall times (after warm-up) of ``mindpipe run`` on 2 CPU processes."""
    cmd = [sys.executable, "-m", "mindpipe.cli", "run", str(plan_path), "--nproc", "2", "--steps", str(steps),
           "--model", str(model_path), "--out", str(out), "--device", "cpu", "--warmup-steps", "1", "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"mindpipe run failed ({res.returncode}):\n{res.stderr[-3000:]}")
    trace = json.loads(out.read_text())
    steps_rec = trace["measurement"]["steps"]
    return [float(s["iteration_s"]) for s in steps_rec[1:]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="training steps per run (the first is warm-up)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating (even, balanced) run pairs")
    ap.add_argument("--no-executor", action="store_true", help="simulate only (prints; writes no results file)")
    args = ap.parse_args(argv)
    cluster = load_cluster(CLUSTER)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plans, summary = tuned_plans(work)
        best = json.loads((work / "tune" / "best_plan.json").read_text())
        sim = {name: simulate(MODEL, cluster, plan).iteration_time_s for name, plan in plans.items()}
        result: dict[str, Any] = {
            "command": ".venv/bin/python benchmarks/tune_partition_balance.py",
            "model": to_dict(MODEL), "cluster": CLUSTER, "plan": {k: v for k, v in to_dict(plans["even"]).items()
                                                                  if k != "partition"},
            "partition": {name: plan.partition for name, plan in plans.items()},
            "tuner_best_partition": best.get("partition"),
            "simulated_iteration_s": sim,
            "simulated_improvement": 1 - sim["balanced"] / sim["even"],
            "tuner_summary": {k: summary[k] for k in ("best_value", "evaluations", "infeasible")},
        }
        print(json.dumps(result, indent=1), file=sys.stderr, flush=True)
        if not args.no_executor:
            model_path = work / "model.json"
            model_path.write_text(json.dumps(to_dict(MODEL)))
            paths = {}
            # The balanced run trains the tuner's own best_plan.json, as a user would after `mindpipe tune`.
            paths["balanced"] = work / "tune" / "best_plan.json"
            if result["tuner_best_partition"] != plans["balanced"].partition:
                paths["balanced"] = work / "plan_balanced.json"
                paths["balanced"].write_text(json.dumps(to_dict(plans["balanced"])))
            paths["even"] = work / "plan_even.json"
            paths["even"].write_text(json.dumps(to_dict(plans["even"])))
            times: dict[str, list[float]] = {"even": [], "balanced": []}
            start = time.perf_counter()
            for rnd in range(args.rounds):
                for name in ("even", "balanced"):
                    got = run_plan(paths[name], model_path, args.steps, work / f"measured_{name}_{rnd}.json")
                    times[name] += got
                    print(f"round {rnd} {name}: {[round(t, 3) for t in got]}", file=sys.stderr, flush=True)
            med = {k: statistics.median(v) for k, v in times.items()}
            result.update({
                "executor": {"nproc": 2, "device": "cpu", "steps_per_run": args.steps, "rounds": args.rounds,
                             "step_times_s": times, "wall_s": time.perf_counter() - start},
                "measured_median_step_s": med,
                "measured_ratio_balanced_over_even": med["balanced"] / med["even"],
                "measured_improvement": 1 - med["balanced"] / med["even"],
                "simulated_ratio_balanced_over_even": sim["balanced"] / sim["even"],
            })
        result["acceptance"] = {
            "simulated_improvement_ge_15pct": result["simulated_improvement"] >= 0.15,
            "tuner_picked_balanced": best.get("partition") == plans["balanced"].partition,
            "executor_confirms_direction": (result["measured_ratio_balanced_over_even"] < 1.0
                                            if "measured_ratio_balanced_over_even" in result else None),
        }
    if not args.no_executor:  # a simulate-only run must not replace the measured figures
        OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("executor", "model")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
