"""Random valid plans through the simulator and the executor: what breaks, and how far memory is off.

The promise is that a plan the contract accepts is one the simulator prices and ``mindpipe run``
runs as simulated. The tests check chosen combinations; this draws random ones from every plan key
(schedules with their virtual stages and micro-batch rules, tp with sequence parallelism, cp with
FlashAttention, ZeRO 0-3 under FSDP2 or Megatron's what-if, per-block keep / recompute / swap /
selective / nongemm policies, stage cuts, lazy copies back, loss chunks, the fused head, what-if
knobs), keeps the ones ``check_plan`` accepts and:

* ``--simulate N``: simulates N of them on GPU and CPU clusters (built-in GPT and Llama models);
  any exception but a one-line ``ContractError`` is a failure; per pipeline rank the planners'
  :class:`~mindpipe.simulator.planning.StageBudget` must equal ``Simulator.memory`` (one owner);
* ``--run N``: runs N of them with ``mindpipe run`` on this CPU (``gpt-mini`` or ``llama-tiny``, 2
  or 4 gloo ranks, fp32, 2 steps); a failed run is a failure, and so is a pipeline rank whose
  measured peak (live-tensor accounting) is more than ``--tolerance`` (default 10 %, issue 16's
  bound) from the simulator's. Each rank's worst action of the last step (the accounted peak while
  it ran against ``Simulator.memory_by_action``) is reported beside it, not judged.

Stop 65 found with it: the tuner's gbs 9 on pp 4 under ZB-H1 (refused by the executor only), tp·pp
with sequence parallelism at micro-batch 1 (failed on its second stage), and swap on ranks of two
stages 10-16 % over the model (fixed; the README's memory rows). Stop 66, with the same runs action
by action: one transient per stage where each backward has its own (ZB-V, interleaved and ZB-H1
swap plans 10-23 % over), FSDP2's gathered weights held after torch reduced a stage's gradients,
a gathered layer counted at the step's end, and a GPT nongemm block's re-saved q, k, v (all fixed).
Runs are seeded, so a failure prints the plan that reproduces it.

Run: ``.venv/bin/python benchmarks/random_plans.py --simulate 300 --run 40 --seed 1`` (about 6
minutes on two cores). Writes ``benchmarks/results/random_plans.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.config import Model, Plan, check_plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import block_policies, stage_layout
from mindpipe.traces.schema import from_dict, to_dict

OUT = Path(__file__).resolve().parent / "results" / "random_plans.json"
SIM_MODELS = ("gpt-mini", "gpt-1.3b", "gpt-13b", "llama3-8b", "llama-tiny", "llama3.2-1b")
SIM_CLUSTERS = ("a100-sxm4-40gb:1x8", "h100-sxm5-80gb:2x8", "cpu:1x4", "a100-sxm4-80gb:1x4")
RUN_MODELS = ("gpt-mini", "llama-tiny")
RUN_CLUSTERS = ("cpu:1x2", "cpu:1x4")


def draw_plan(rng: random.Random, model: Model, devices: int, fp8: bool) -> dict[str, Any]:
    """One random plan of ``devices`` ranks: mostly valid, the contract decides."""
    sched = rng.choice(["gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv", "dualpipev"])
    v = {"interleaved_1f1b": rng.choice([2, 3]), "zbv": 2, "dualpipev": 2}.get(sched, 1)
    pp = rng.choice([2, 4]) if sched != "gpipe" or rng.random() < 0.7 else 1
    tp, cp = rng.choice([1, 2]), rng.choice([1, 1, 2])
    if devices % (pp * tp * cp):
        pp, tp, cp = 2, 1, 1
    dp = devices // (pp * tp * cp)
    mb = rng.choice([1, 2, 3])
    m = rng.choice([pp, 2 * pp, 3 * pp]) * (2 if sched == "dualpipev" else 1)
    d: dict[str, Any] = {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "micro_batch_size": mb,
                         "global_batch_size": mb * m * dp, "schedule": sched, "virtual_stages": v}
    if cp > 1:
        d.update(flash_attention=True, cp_comm_type=rng.choice(["allgather", "p2p"]))
    if tp > 1 and rng.random() < 0.5:
        d.update(sequence_parallel=True, tp_comm_overlap=rng.random() < 0.5)
    d["dp_impl"] = rng.choice(["fsdp2", "megatron"])
    d["zero_stage"] = rng.choice([0, 1, 2, 3]) if d["dp_impl"] == "fsdp2" else rng.choice([0, 1])
    if d["dp_impl"] == "megatron" and d["zero_stage"] == 1 and rng.random() < 0.5:
        d["overlap_param_gather"] = True
    for key, values in (("precision", ["fp32", "bf16"] + (["fp8"] if fp8 else [])), ("comm_priority", ["fair", "pp_first"]),
                        ("overlap_grad_reduce", [True, False]), ("loss_chunks", [1, 2, 4]),
                        ("fused_head_loss", [True, False]), ("blocking_p2p", [True, False]),
                        ("fused_elementwise", [True, False]), ("rank_order", ["tp-dp-pp", "pp-dp-tp", "dp-tp-pp"]),
                        ("flash_attention", [True])):
        if rng.random() < 0.4:
            d[key] = rng.choice(values)
    layers, stages = model.num_layers, pp * v
    if rng.random() < 0.6:
        pols = ["keep", "recompute", "swap", "selective"] + (["nongemm"] if tp == 1 else [])
        d["layer_memory_policy"] = [rng.choice(pols) for _ in range(layers)]
    else:
        d["recompute"] = rng.choice(["none", "selective", "full"])
    if rng.random() < 0.4 and 1 < stages <= layers:
        cuts = [0, *sorted(rng.sample(range(1, layers), stages - 1)), layers]
        d["partition"] = [b - a for a, b in itertools.pairwise(cuts)]
    if rng.random() < 0.3 and stages > 1:
        d["stage_cuts"] = [rng.choice(["between_blocks", "after_attention"]) for _ in range(stages - 1)]
    if rng.random() < 0.3:
        d["swap_copy_back"] = [rng.choice(["prefetch", "lazy"]) for _ in range(stages)]
    return d


def simulate_plans(rng: random.Random, n: int) -> dict[str, Any]:
    """``--simulate``: crashes and budget/memory disagreements over ``n`` accepted plans."""
    failures: list[dict[str, Any]] = []
    accepted = refused = 0
    while accepted < n:
        model, cluster = load_model(rng.choice(SIM_MODELS)), load_cluster(rng.choice(SIM_CLUSTERS))
        d = draw_plan(rng, model, cluster.num_nodes * cluster.gpus_per_node, cluster.gpu.startswith("h100"))
        sim = Simulator(model, cluster)
        try:
            plan = from_dict(Plan, d, "plan")
            sim.check(plan)
        except ContractError as e:
            refused += 1
            if "\n" in str(e):
                failures.append({"model": model.name, "cluster": cluster.name, "plan": d, "error": "multi-line refusal"})
            continue
        accepted += 1
        try:
            res = sim.run(plan)
            if not res.iteration_time_s > 0:
                raise AssertionError(f"iteration time {res.iteration_time_s}")
            # The per-action series never exceeds the rank's peak (one evaluator for both); the peak
            # may sit between actions: after the last backward, once its gradients exist.
            for rm, series in zip(sim.memory(plan), sim.memory_by_action(plan), strict=True):
                if max(series) > rm.total_bytes * (1 + 1e-9):
                    raise AssertionError(f"rank {rm.rank}: peak by action {max(series)} > memory {rm.total_bytes}")
            if plan.virtual_stages == 1:  # the planners' per-stage budgets: one stage per rank
                mem, pols = sim.memory(plan), block_policies(plan, model.num_layers)
                for span, budget in zip(stage_layout(plan, model), sim.stage_budgets(plan), strict=True):
                    got = budget.memory([pols[b] for b in span.blocks], [span.part(b) for b in span.blocks])
                    want = mem[span.rank]
                    if abs(got.total_bytes - want.total_bytes) > 1e-6 * max(1.0, want.total_bytes):
                        raise AssertionError(f"stage {span.stage}: budget {got.total_bytes} != memory {want.total_bytes}")
        except Exception as e:  # every failure is reported with its plan
            failures.append({"model": model.name, "cluster": cluster.name, "plan": d,
                             "error": "".join(traceback.format_exception_only(e)).strip()})
    return {"accepted": accepted, "refused_by_the_contract": refused, "failures": failures}


def run_plans(rng: random.Random, n: int, tolerance: float) -> dict[str, Any]:
    """``--run``: ``mindpipe run`` of ``n`` accepted plans on this CPU, memory against the model."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1"}
    runs: list[dict[str, Any]] = []
    while len(runs) < n:
        name, cname = rng.choice(RUN_MODELS), rng.choice(RUN_CLUSTERS)
        model, cluster = load_model(name), load_cluster(cname)
        d = {**draw_plan(rng, model, cluster.gpus_per_node, False), "precision": "fp32"}
        try:
            plan = from_dict(Plan, d, "plan")
            check_plan(plan, model, cluster)
        except ContractError:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "plan.json"
            path.write_text(json.dumps(to_dict(plan)))
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "mindpipe.cli", "run", str(path), "--nproc", str(plan.world_size),
                                   "--steps", "2", "--model", name, "--device", "cpu", "--out", str(Path(tmp) / "m.json")],
                                  capture_output=True, text=True, env=env, timeout=900, check=False)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("memory, pipeline rank")]
        errors = [float(ln.rsplit("(", 1)[1].split("%")[0]) for ln in lines]
        per_action = [float(ln.split(": worst ", 1)[1].split(" %")[0]) for ln in done.stdout.splitlines()
                      if ln.startswith("memory per action, pipeline rank")]
        worst = max(errors, key=abs, default=None)
        ok = done.returncode == 0 and worst is not None and abs(worst) <= 100 * tolerance
        runs.append({"model": name, "ranks": plan.world_size, "plan": d, "returncode": done.returncode,
                     "memory_error_pct": errors, "action_memory_error_pct": per_action, "seconds": round(time.perf_counter() - t0, 1), "ok": ok,
                     "error": None if done.returncode == 0 else (done.stderr.strip().splitlines() or [""])[-1][:500]})
        print(f"{'ok  ' if ok else 'FAIL'} {name} {plan.world_size} ranks, memory {errors}, by action {per_action}: "
              f"{json.dumps(d)}", flush=True)
    failed = [r for r in runs if not r["ok"]]
    every = [abs(e) for r in runs for e in r["memory_error_pct"]]
    # Each rank's worst action of the last step (ActionRecord.memory_bytes against
    # Simulator.memory_by_action): reported, not a failure (the bound is on the peak).
    actions = [abs(e) for r in runs for e in r["action_memory_error_pct"]]
    return {"runs": len(runs), "failed": len(failed), "tolerance": tolerance,
            "worst_memory_error_pct": max(every, default=None),
            "worst_action_memory_error_pct": max(actions, default=None),
            "ranks_with_an_action_over_tolerance": sum(1 for e in actions if e > 100 * tolerance),
            "ranks_compared_by_action": len(actions), "failures": failed, "all": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--simulate", type=int, default=300, help="plans to simulate (default 300)")
    parser.add_argument("--run", type=int, default=40, help="plans to run on this CPU (default 40)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tolerance", type=float, default=0.10, help="memory error allowed per rank (default 0.10)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    payload: dict[str, Any] = {"what": "random valid plans: simulated (crashes, budgets vs memory) and run on this CPU "
                                       "(failures, memory vs the model)", "seed": args.seed}
    payload["simulated"] = simulate_plans(rng, args.simulate)
    print(f"simulated {payload['simulated']['accepted']} plans: {len(payload['simulated']['failures'])} failures",
          flush=True)
    payload["ran"] = run_plans(rng, args.run, args.tolerance)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1) + "\n")
    ran = payload["ran"]
    print(json.dumps({"simulated": payload["simulated"]["accepted"], "simulation_failures": len(payload["simulated"]["failures"]),
                      "ran": ran["runs"], "run_failures": ran["failed"],
                      "worst_memory_error_pct": ran["worst_memory_error_pct"],
                      "worst_action_memory_error_pct": ran["worst_action_memory_error_pct"],
                      "ranks_with_an_action_over_tolerance": ran["ranks_with_an_action_over_tolerance"],
                      "ranks_compared_by_action": ran["ranks_compared_by_action"]}, indent=1))


if __name__ == "__main__":
    main()
