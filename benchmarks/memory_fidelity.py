"""Memory fidelity on this CPU: simulated vs measured peak memory per pipeline rank, and the budget (issue 16).

Part 1 runs gpt-mini-sized models (``gpt-mini``: 4 blocks; ``gpt-mini-8``: the same with 8) on 2
and 4 CPU ranks (gloo) under pipeline and data parallel plans with mixed per-layer policies
(keep / recompute / swap / nongemm), with ``mindpipe run``, and compares each rank's measured peak (the
executor's live-tensor accounting, ``ranks[].memory`` in ``measured.json``) with the simulator's
``Simulator.memory(plan)`` for the same rank: relative error = (simulated − measured) / measured.

Part 2, for each budget case: steps the micro-batch size (global batch = micro × micro-batches ×
dp) through ``Simulator.memory`` at the budget to find the largest global batch the simulator
says fits, runs it with ``mindpipe run --memory-budget-gib`` (it must finish within the budget),
then the next size up: ``mindpipe run`` must refuse it, and started under torchrun directly (no
pre-check) the ranks must stop when their accounted memory exceeds the budget.

Target: every run within 10 % (goal 5 %). Writes ``benchmarks/results/memory_fidelity.json``.

    .venv/bin/python benchmarks/memory_fidelity.py [--steps 3] [--out benchmarks/results/memory_fidelity.json]
        [--schedule S | --policy P | --tp | --fused | --tied]   (only part 1's plans of schedule S / with a block of
        policy P / tensor-parallel / with fused_head_loss / of a tied-head model; a partial run replaces its plans' rows in the
        results file and keeps the rest)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from mindpipe.executor.launch import free_port
from mindpipe.simulator.calibrate.memory_fidelity import memory_rows
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.builtin import load_model
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import to_dict
from mindpipe.traces.trace import Trace

HERE = Path(__file__).resolve().parent
GIB = 2**30
TARGET, GOAL = 0.10, 0.05
MINI = load_model("gpt-mini")
MINI8 = replace(MINI, num_layers=8, name="gpt-mini-8")
TIED = replace(load_model("llama-tiny"), tie_embeddings=True, name="llama-tiny-tied")
MODELS = {"gpt-mini": MINI, "gpt-mini-8": MINI8, "gpt-tiny-8k": load_model("gpt-tiny-8k"), "llama-tiny-tied": TIED}
FP32 = {"precision": "fp32"}
# (model, ranks, plan): pipeline and data parallel plans with mixed per-layer policies.
FIDELITY: list[tuple[str, int, dict[str, Any]]] = [
    ("gpt-mini", 2, {"pp": 2, "micro_batch_size": 2, "global_batch_size": 8, "schedule": "1f1b",
                     "layer_memory_policy": ["keep", "recompute", "swap", "keep"], **FP32}),
    ("gpt-mini", 2, {"dp": 2, "micro_batch_size": 2, "global_batch_size": 8,
                     "layer_memory_policy": ["swap", "recompute", "keep", "keep"], **FP32}),
    ("gpt-mini", 2, {"pp": 2, "micro_batch_size": 4, "global_batch_size": 16, "schedule": "1f1b", "recompute": "full",
                     **FP32}),
    ("gpt-mini-8", 4, {"pp": 4, "micro_batch_size": 2, "global_batch_size": 16, "schedule": "1f1b",
                       "layer_memory_policy": ["keep", "recompute", "swap", "keep", "recompute", "keep", "keep", "swap"],
                       **FP32}),
    ("gpt-mini-8", 4, {"dp": 2, "pp": 2, "micro_batch_size": 2, "global_batch_size": 16, "schedule": "1f1b",
                       "layer_memory_policy": ["swap", "keep", "recompute", "keep", "keep", "swap", "recompute", "keep"],
                       **FP32}),
    # A stage copying its swapped block back as the backward asks (swap_copy_back lazy), not prefetched.
    ("gpt-mini-8", 4, {"pp": 4, "micro_batch_size": 2, "global_batch_size": 16, "schedule": "1f1b",
                       "layer_memory_policy": ["keep", "recompute", "swap", "keep", "recompute", "keep", "keep", "swap"],
                       "swap_copy_back": ["prefetch", "lazy", "prefetch", "prefetch"], **FP32}),
    ("gpt-mini-8", 4, {"dp": 4, "micro_batch_size": 2, "global_batch_size": 16,
                       "layer_memory_policy": ["recompute"] * 4 + ["keep"] * 4, **FP32}),
    # Zero-bubble: torch's input-gradient pass keeps the graph (retain_graph) for W, so what a stage
    # saved stays until W except the loss's side of the LM head (simulator.actions, simulator.memory).
    ("gpt-tiny-8k", 2, {"pp": 2, "micro_batch_size": 4, "global_batch_size": 16, "schedule": "zb_h1", **FP32}),
    # DawnPiper's per-operator policy: GEMM outputs kept, every other operator re-run (torch's
    # selective activation checkpointing; traces/layout.py ``nongemm``).
    ("gpt-mini", 2, {"pp": 2, "micro_batch_size": 4, "global_batch_size": 16, "schedule": "1f1b",
                     "layer_memory_policy": ["nongemm", "nongemm", "keep", "nongemm"], **FP32}),
    ("gpt-mini-8", 4, {"dp": 2, "pp": 2, "micro_batch_size": 2, "global_batch_size": 16, "schedule": "1f1b",
                       "layer_memory_policy": ["nongemm", "keep", "recompute", "nongemm", "nongemm", "swap", "nongemm",
                                               "keep"], **FP32}),
    ("gpt-mini-8", 4, {"pp": 4, "micro_batch_size": 2, "global_batch_size": 16, "schedule": "zb_h1",
                       "layer_memory_policy": ["keep", "recompute", "swap", "keep", "recompute", "keep", "keep", "swap"],
                       **FP32}),
    # Two recomputed blocks on one stage under a split backward: W re-runs both in one pass.
    ("gpt-mini-8", 2, {"pp": 2, "micro_batch_size": 2, "global_batch_size": 8, "schedule": "zb_h1",
                       "layer_memory_policy": ["keep", "recompute", "keep", "keep", "recompute", "recompute", "keep",
                                               "keep"], **FP32}),
    # One recomputed block among five: torch's W pass per parameter group (traces.layout.one_weight_pass),
    # which re-runs it once per group (the simulator counts those re-runs whole, an upper bound).
    ("gpt-mini-8", 2, {"pp": 2, "micro_batch_size": 2, "global_batch_size": 8, "schedule": "zb_h1",
                       "partition": [3, 5],
                       "layer_memory_policy": ["keep", "keep", "keep", "recompute", "keep", "keep", "keep", "keep"],
                       **FP32}),
    # Tensor parallelism: the token table, the LM head and the loss vocabulary-parallel
    # (traces/torch_gpt.py VocabShard), as the simulator divides them by t.
    ("gpt-mini", 2, {"tp": 2, "micro_batch_size": 2, "global_batch_size": 8, "sequence_parallel": True,
                     "recompute": "selective", **FP32}),
    ("gpt-mini-8", 4, {"tp": 2, "pp": 2, "micro_batch_size": 2, "global_batch_size": 16, "schedule": "1f1b",
                       "layer_memory_policy": ["keep", "recompute", "swap", "keep", "keep", "swap", "recompute", "keep"],
                       **FP32}),
    # ZeRO under FSDP2 (traces/layout.py keeps_gathered_weights, accumulates_whole_gradients):
    # replicate's and fully_shard's gathered copies, mixed precision's fp32 accumulated gradients.
    ("gpt-mini", 2, {"dp": 2, "micro_batch_size": 2, "global_batch_size": 8, "zero_stage": 0, "precision": "bf16"}),
    ("gpt-mini", 2, {"dp": 2, "micro_batch_size": 2, "global_batch_size": 8, "zero_stage": 1, "precision": "bf16"}),
    ("gpt-mini", 4, {"dp": 2, "pp": 2, "micro_batch_size": 2, "global_batch_size": 8, "schedule": "1f1b",
                     "zero_stage": 2, **FP32}),
    ("gpt-mini", 4, {"dp": 2, "pp": 2, "micro_batch_size": 2, "global_batch_size": 8, "schedule": "1f1b",
                     "zero_stage": 3, "precision": "bf16"}),
    ("gpt-mini", 2, {"dp": 2, "micro_batch_size": 2, "global_batch_size": 8, "zero_stage": 3, **FP32}),
    # The LM head fused into the chunked loss (fused_head_loss, traces/torch_head_loss.py): no logits
    # kept; the last stage's forward ends in the loss, under FSDP2 gathered with the stage.
    ("gpt-tiny-8k", 2, {"pp": 2, "micro_batch_size": 4, "global_batch_size": 16, "schedule": "1f1b",
                        "loss_chunks": 8, "fused_head_loss": True, "precision": "bf16"}),
    ("gpt-tiny-8k", 2, {"dp": 2, "micro_batch_size": 4, "global_batch_size": 16, "zero_stage": 3,
                        "loss_chunks": 8, "fused_head_loss": True, **FP32}),
    ("gpt-tiny-8k", 2, {"tp": 2, "micro_batch_size": 4, "global_batch_size": 16, "sequence_parallel": True,
                        "loss_chunks": 8, "fused_head_loss": True, **FP32}),
    # A tied LM head under pipelining: the last stage holds a copy of the token table, with its
    # gradient and optimizer state (traces/layout.py tied_table_ranks); under ZB-V one rank holds both.
    ("llama-tiny-tied", 4, {"tp": 2, "pp": 2, "micro_batch_size": 2, "global_batch_size": 8, "schedule": "1f1b",
                            **FP32}),
    ("llama-tiny-tied", 4, {"dp": 2, "pp": 2, "virtual_stages": 2, "micro_batch_size": 1, "global_batch_size": 8,
                            "schedule": "zbv", "zero_stage": 3, **FP32}),
]
# (model, ranks, plan at micro-batch size 1, budget GiB): the batch search at a budget.
BUDGET: list[tuple[str, int, dict[str, Any], float]] = [
    ("gpt-mini", 2, {"pp": 2, "micro_batch_size": 1, "global_batch_size": 4, "schedule": "1f1b",
                     "layer_memory_policy": ["keep", "recompute", "swap", "keep"], **FP32}, 0.07),
    ("gpt-mini-8", 4, {"pp": 4, "micro_batch_size": 1, "global_batch_size": 4, "schedule": "1f1b",
                       "layer_memory_policy": ["keep", "recompute", "swap", "keep", "recompute", "keep", "keep", "swap"],
                       **FP32}, 0.06),
]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.update({"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"})
    e["PYTHONPATH"] = str(HERE.parent) + os.pathsep + e.get("PYTHONPATH", "")
    return e


def simulated(model: Model, plan: Plan) -> list[float]:
    """Per pipeline rank, the simulator's peak bytes of ``plan`` on this CPU."""
    sim = Simulator(model, Cluster(gpu="cpu", num_nodes=1, gpus_per_node=plan.world_size))
    return [r.total_bytes for r in sim.memory(plan)]


def fits(model: Model, plan: Plan, budget_gib: float) -> bool:
    """The simulator's verdict at an emulated capacity per rank, asked as ``mindpipe run
    --memory-budget-gib`` asks it (:func:`mindpipe.cli.run.memory_check`, each rank its own device).
    Asked of a CPU cluster directly, the budget would be the host's, shared by its ranks."""
    from mindpipe.cli.run import memory_check

    device = replace(get_device("cpu"), memory_capacity_bytes=int(budget_gib * GIB))
    try:
        memory_check(model, plan, device, 1)
    except ContractError:
        return False
    return True


def run(model_name: str, nproc: int, plan: dict[str, Any], steps: int, tmp: Path, *extra: str) -> tuple[int, str, Trace | None]:
    out = tmp / "measured.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "mindpipe.cli", "run", json.dumps(plan), "--nproc", str(nproc), "--steps", str(steps),
           "--model", json.dumps(to_dict(MODELS[model_name])), "--out", str(out), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=900)
    last = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ""
    return res.returncode, last, Trace.load(out) if res.returncode == 0 else None


def run_unchecked(model_name: str, nproc: int, plan: dict[str, Any], steps: int, tmp: Path, budget: float) -> tuple[int, str]:
    """Under torchrun directly (no simulator pre-check): does the run itself stop at the budget?"""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "-m", "mindpipe.executor", json.dumps(plan), "--steps", str(steps),
           "--model", json.dumps(to_dict(MODELS[model_name])), "--out", str(tmp / "unchecked.json"),
           "--memory-budget-gib", repr(budget)]
    e = env()
    e["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    res = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=900)
    line = next((ln for ln in res.stderr.splitlines() if "executor: error:" in ln), "")
    return res.returncode, line.strip()


def compare(trace: Trace, model: Model) -> list[dict[str, Any]]:
    """Per rank: measured and simulated peak bytes and the relative error (``memory_rows``), with the terms."""
    m = trace.measurement
    assert m is not None
    terms = {r.rank: r.memory for r in m.ranks}
    keys = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "transient_bytes",
            "host_pool_peak_bytes")
    return [{"rank": row.rank, "pp_rank": row.pp_rank, "stages": row.stages, "measured_bytes": row.measured_bytes,
             "simulated_bytes": row.predicted_bytes, "rel_error": row.rel_error,
             "host_measured_bytes": row.measured_host_bytes, "host_simulated_bytes": row.predicted_host_bytes,
             "terms": {k: getattr(terms[row.rank], k) for k in keys}} for row in memory_rows(m, model)]


def fidelity(steps: int, tmp: Path, schedule: str | None = None, policy: str | None = None,
             tp: bool = False, fused: bool = False, tied: bool = False) -> list[dict[str, Any]]:
    """Part 1 over ``FIDELITY`` (only the plans of ``schedule`` when given, 1f1b when a plan names none;
    only those with a block of ``policy`` when given; only tensor-parallel ones with ``tp``; only
    those with ``fused_head_loss`` with ``fused``; only a tied model's with ``tied``)."""
    out = []
    for name, nproc, plan in FIDELITY:
        if tp and plan.get("tp", 1) == 1:
            continue
        if fused and not plan.get("fused_head_loss"):
            continue
        if tied and not MODELS[name].tie_embeddings:
            continue
        if schedule is not None and plan.get("schedule", "1f1b") != schedule:
            continue
        if policy is not None and policy not in plan.get("layer_memory_policy", []):
            continue
        code, last, trace = run(name, nproc, plan, steps, tmp)
        if trace is None:
            raise RuntimeError(f"{name} {plan}: run failed ({code}): {last}")
        rows = compare(trace, MODELS[name])
        worst = max(abs(r["rel_error"]) for r in rows)
        print(f"{name} on {nproc} ranks {json.dumps(plan)}: worst |error| {100 * worst:.2f} %", file=sys.stderr)
        for r in rows:
            host = (f"; host pool measured {r['host_measured_bytes'] / 2**20:.3f} MiB, simulated "
                    f"{r['host_simulated_bytes'] / 2**20:.3f} MiB" if r["host_measured_bytes"] else "")
            print(f"  rank {r['rank']} (pp {r['pp_rank']}): measured {r['measured_bytes'] / 2**20:8.2f} MiB, simulated "
                  f"{r['simulated_bytes'] / 2**20:8.2f} MiB, {100 * r['rel_error']:+.2f} %{host}", file=sys.stderr)
        out.append({"model": name, "ranks": nproc, "plan": plan, "per_rank": rows, "worst_abs_rel_error": worst})
    return out


def largest_fitting(model: Model, plan: dict[str, Any], budget: float, limit: int = 64) -> dict[str, Any] | None:
    """The plan with the largest micro-batch size (hence global batch) the simulator fits in ``budget``."""
    per_mb = plan["global_batch_size"] // plan["micro_batch_size"]
    best = None
    for mbs in range(1, limit + 1):
        candidate = {**plan, "micro_batch_size": mbs, "global_batch_size": mbs * per_mb}
        if not fits(model, Plan(**candidate), budget):
            break
        best = candidate
    return best


def budget_cases(steps: int, tmp: Path) -> list[dict[str, Any]]:
    out = []
    for name, nproc, plan, budget in BUDGET:
        model = MODELS[name]
        best = largest_fitting(model, plan, budget)
        if best is None:
            raise RuntimeError(f"{name}: nothing fits in {budget} GiB")
        per_mb = best["global_batch_size"] // best["micro_batch_size"]
        up = {**best, "micro_batch_size": best["micro_batch_size"] + 1,
              "global_batch_size": (best["micro_batch_size"] + 1) * per_mb}
        code, last, trace = run(name, nproc, best, steps, tmp, "--memory-budget-gib", repr(budget))
        rows = compare(trace, model) if trace is not None else []
        within = trace is not None and all(r["measured_bytes"] <= budget * GIB for r in rows)
        up_code, up_line, _ = run(name, nproc, up, steps, tmp, "--memory-budget-gib", repr(budget))
        raw_code, raw_line = run_unchecked(name, nproc, up, steps, tmp, budget)
        case = {
            "model": name, "ranks": nproc, "budget_gib": budget, "largest_fitting_plan": best,
            "largest_global_batch": best["global_batch_size"], "fit_run_exit": code, "fit_run_message": last,
            "fit_run_within_budget": within,
            "fit_run_per_rank": rows, "next_plan": up, "next_simulated_gib": [b / GIB for b in simulated(model, Plan(**up))],
            "next_refused_exit": up_code, "next_refused_message": up_line, "next_unchecked_exit": raw_code,
            "next_unchecked_message": raw_line,
        }
        print(f"{name} on {nproc} ranks, budget {budget} GiB: largest global batch {best['global_batch_size']} "
              f"(micro {best['micro_batch_size']}) ran within budget: {within}; next size refused (exit {up_code}); "
              f"unchecked run stopped (exit {raw_code}): {raw_line[:160]}", file=sys.stderr)
        out.append(case)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results" / "memory_fidelity.json"))
    ap.add_argument("--schedule", help="run only part 1's plans of this schedule (e.g. zb_h1); no budget cases")
    ap.add_argument("--policy", help="run only part 1's plans with a block of this policy (e.g. nongemm); no budget cases")
    ap.add_argument("--tp", action="store_true", help="run only part 1's tensor-parallel plans; no budget cases")
    ap.add_argument("--fused", action="store_true", help="run only part 1's fused_head_loss plans; no budget cases")
    ap.add_argument("--tied", action="store_true", help="run only part 1's plans of a tied-head model; no budget cases")
    args = ap.parse_args()
    only = args.schedule is not None or args.policy is not None or args.tp or args.fused or args.tied
    with tempfile.TemporaryDirectory(prefix="memory-fidelity-") as d:
        runs = fidelity(args.steps, Path(d), args.schedule, args.policy, args.tp, args.fused, args.tied)
        budgets = budget_cases(args.steps, Path(d)) if not only else []
    if only and Path(args.out).exists():
        # A partial run replaces its own plans' rows in the results file and keeps the rest.
        kept = json.loads(Path(args.out).read_text())
        done = {(r["model"], json.dumps(r["plan"], sort_keys=True)) for r in runs}
        runs = [r for r in kept["runs"] if (r["model"], json.dumps(r["plan"], sort_keys=True)) not in done] + runs
        budgets = kept["budgets"]
    errors = [abs(r["rel_error"]) for run in runs for r in run["per_rank"]]
    errors += [abs(r["rel_error"]) for case in budgets for r in case["fit_run_per_rank"]]
    # The host pool of swapped activations, relative to the measured pool.
    host = [abs(r["host_simulated_bytes"] - r["host_measured_bytes"]) / r["host_measured_bytes"]
            for run in runs for r in run["per_rank"] if r.get("host_measured_bytes")]
    summary = {
        "worst_host_pool_rel_error": max(host, default=None),
        "worst_abs_rel_error": max(errors), "target": TARGET, "goal": GOAL, "meets_target": max(errors) <= TARGET,
        "meets_goal": max(errors) <= GOAL,
        "budgets_hold": all(c["fit_run_exit"] == 0 and c["fit_run_within_budget"] and c["next_refused_exit"] == 2
                            and c["next_unchecked_exit"] != 0 for c in budgets),
        "memory_source": "tensor_accounting (mindpipe.executor.memory_account)", "cpus": os.cpu_count(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"summary": summary, "runs": runs, "budgets": budgets}, indent=1) + "\n")
    print(json.dumps(summary))
    return 0 if summary["meets_target"] and summary["budgets_hold"] else 1


if __name__ == "__main__":
    sys.exit(main())
