"""How much a per-operator memory policy could add at vpipe's maximum batch (issue 16's 1.2× point).

DawnPiper (Peng et al. 2025; BACKGROUND.md §4.3) plans memory per tensor on a fine-grained graph
(Capuchin-style: free swap, else recompute ranked by bytes per second, else exposed swap); vPipe
(Zhao et al. TPDS'21) only keeps, re-runs or swaps whole layers. This benchmark bounds, with the
simulator's own cost and memory models, what the finer choice can buy on the three setups of
:mod:`max_batch` (same models, clusters, meshes, m = pp micro-batches) before anything is built:

* ``ceiling_keep_all``: vpipe's plan at its maximum batch with every block kept (no re-run, no
  swap), memory ignored, over vpipe's throughput — no memory policy of any granularity beats it.
* ``ceiling_no_gemm_rerun``: every block vpipe re-runs instead re-runs only its attention core
  (the simulator's ``selective`` price), memory ignored. The cheapest per-operator policy that
  re-runs no GEMM re-runs at least the attention core (it keeps Q, K, V but not the s²-sized
  softmax output) plus LayerNorms and GeLU, so this price is a lower bound on its time and the
  ratio an upper bound on what it can give.
* ``no_gemm_rerun_bytes``: what such a block keeps per micro-batch (Korthikanti et al. 2022's
  tensors, BACKGROUND.md §2): the block input and the LN2 input (the LayerNorms re-run from
  them), Q, K, V (the core re-runs from them) and the GeLU input (the GeLU re-runs from it) —
  2·d·s·b·h/σ + (3 + f/h)·d·s·b·h/t with σ = t under sequence parallelism, else 1; masks are
  re-drawn from the saved RNG state. At t = 1, f = 4h, d = 2: 18·s·b·h against 2·s·b·h for a
  re-run block (vPipe's checkpoint). The block policy that runs, ``nongemm``
  (:mod:`mindpipe.traces.layout`), keeps the projection's output in place of the LN2 input (the
  same bytes at t = 1) and, with dropout, fc2's output too, so it keeps at least this much: the
  figures here stay bounds for it.
* ``headroom``: per stage of vpipe's plan, the free bytes at its peak, the micro-batches in
  flight k_s, and how many of its re-run blocks fit as no-GEMM-re-run blocks
  (⌊free / (k_s·(no_gemm_rerun_bytes − checkpoint))⌋). Over vpipe's slowest stage:
  ``estimate_rebalanced_only`` is the mean stage time (stages perfectly rebalanced, no conversion),
  ``estimate_with_headroom`` the mean with those conversions (each saving forward − core) —
  both optimistic, since moving blocks also moves memory; ``no_gemm_rerun_share_with_headroom``
  is their quotient, the part the per-operator policy itself adds.
* ``max_batch_head_bound``: the largest micro-batch whose last stage fits holding the LM head
  and one swapped block (its least memory), so the largest global batch any block policy can
  reach; over vpipe's maximum batch it bounds dawnpiper's max-batch ratio (searched up to 4× vpipe's
  micro-batch: a bound of 4.0 means the head does not bind there).

Run from the repository root (about a minute)::

    .venv/bin/python benchmarks/opmem_bound.py [--setup N]

Writes ``benchmarks/results/opmem_bound.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from max_batch import SETUPS
from mindpipe.simulator.costs import DTYPE_BYTES
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.config import Model, Plan
from mindpipe.tuner.materialize import Problem, materialize
from mindpipe.tuner.maxbatch import base_point, point_at, search
from mindpipe.tuner.memsplit import stage_model

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results" / "opmem_bound.json"
GIB = 2**30


def no_gemm_rerun_bytes(model: Model, plan: Plan) -> float:
    """Bytes a block keeps per micro-batch when it re-runs every operator but its four GEMMs (module docstring)."""
    s, b, h, t = model.seq_len, plan.micro_batch_size, model.hidden_size, plan.tp
    d = DTYPE_BYTES[plan.precision]
    sigma = t if plan.sequence_parallel else 1
    return 2 * d * s * b * h / sigma + (3 + model.ffn / h) * d * s * b * h / t


def _with_policy(plan: Plan, policy: list[str]) -> Plan:
    return dataclasses.replace(plan, layer_memory_policy=policy)


def head_bound(problem: Problem, base: dict[str, Any], pp: int, top: int) -> int:
    """Largest micro-batch ≤ ``top`` whose last stage fits with the head and the least it can hold of
    blocks: one block, or a cut block's MLP part, swapped or re-run."""
    sim = problem.simulator()

    def fits(mbs: int) -> bool:
        plan = Plan(**{k: v for k, v in point_at(base, mbs, pp).items() if k != "partitioner"})
        last = sim.stage_budgets(plan)[-1]
        least = min(last.total_bytes([p], [part]) for p in ("swap", "full") for part in ("whole", "mlp"))
        return least <= last.capacity_bytes

    lo, hi = 0, top + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def bound(model: Model | str, cluster: str, fixes: dict[str, Any]) -> dict[str, Any]:
    """The figures of the module docstring for one setup."""
    problem = Problem(load_model(model), load_cluster(cluster))
    sim = problem.simulator()
    vp = search(problem, fixes, "vpipe")[0]
    mbs, pp = vp.micro_batch_size, fixes["pp"]
    plan = materialize(problem, point_at(base_point(fixes["dp"], fixes["tp"], pp, "vpipe", fixes), mbs, pp)).plan
    policy = list(plan.layer_memory_policy or [])
    thr = sim.run(plan).throughput_samples_per_s
    keep_all = sim.run(_with_policy(plan, ["keep"] * len(policy))).throughput_samples_per_s
    core_only = ["selective" if p == "recompute" else p for p in policy]
    no_gemm = sim.run(_with_policy(plan, core_only)).throughput_samples_per_s

    m = sim.model
    budgets = sim.stage_budgets(plan)
    ckpt = budgets[0].block_bytes("full")
    opm = no_gemm_rerun_bytes(m, plan)
    sm = stage_model(sim, plan)
    ranks = sim.memory(plan)
    stages, lo = [], 0
    for s, n in enumerate(plan.partition or []):
        pol = policy[lo:lo + n]
        t_now = sm.time_of(s, lo, lo + n, pol)
        free = ranks[s].capacity_bytes - ranks[s].total_bytes
        k = budgets[s].in_flight
        fit = int(max(free, 0.0) // (k * (opm - ckpt)))
        conv = min(fit, pol.count("recompute"))
        idx = [i for i, p in enumerate(pol) if p == "recompute"][-conv:] if conv else []
        t_new = sm.time_of(s, lo, lo + n, ["selective" if i in idx else p for i, p in enumerate(pol)])
        stages.append({"stage": s, "blocks": n, "rerun_blocks": pol.count("recompute"), "in_flight": k,
                       "free_gib": round(free / GIB, 2), "blocks_that_fit_no_gemm_rerun": conv,
                       "stage_time_s": round(t_now, 4), "stage_time_converted_s": round(t_new, 4)})
        lo += n
    slowest = max(st["stage_time_s"] for st in stages)
    balanced_now = sum(st["stage_time_s"] for st in stages) / len(stages)
    balanced = sum(st["stage_time_converted_s"] for st in stages) / len(stages)
    base = base_point(fixes["dp"], fixes["tp"], pp, "vpipe", fixes)
    top = head_bound(problem, base, pp, 4 * mbs)
    cost = next(c for c in sim.layer_costs(plan) if c.kind == "block")
    return {
        "vpipe_max_micro_batch": mbs, "vpipe_max_global_batch": vp.global_batch_size,
        "vpipe_policy_counts": {p: policy.count(p) for p in sorted(set(policy))},
        "vpipe_throughput": thr,
        "block_seconds": {"forward": cost.forward_s,
                          "forward_plus_backward": cost.forward_s + cost.backward_input_s + cost.backward_weight_s,
                          "attention_core_rerun": cost.recompute_selective_s},
        "block_gib_per_microbatch": {"keep": budgets[0].block_bytes("none") / GIB,
                                     "selective": budgets[0].block_bytes("selective") / GIB,
                                     "no_gemm_rerun": opm / GIB, "recompute_checkpoint": ckpt / GIB},
        "ceiling_keep_all": keep_all / thr,
        "ceiling_no_gemm_rerun": no_gemm / thr,
        "headroom": stages,
        "estimate_rebalanced_only": slowest / balanced_now,
        "estimate_with_headroom": slowest / balanced,
        "no_gemm_rerun_share_with_headroom": balanced_now / balanced,
        "max_batch_head_bound": {"micro_batch": top, "searched_up_to_micro_batch": 4 * mbs, "global_batch": top * pp * fixes["dp"],
                                 "over_vpipe_max_batch": top * pp * fixes["dp"] / vp.global_batch_size},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--setup", type=int, action="append", help="index into max_batch.SETUPS (default: all)")
    args = parser.parse_args()
    labels = list(SETUPS)
    chosen = [labels[i] for i in args.setup] if args.setup else labels
    results = {}
    for label in chosen:
        results[label] = bound(*SETUPS[label])
        r = results[label]
        print(label, json.dumps({k: r[k] for k in ("ceiling_keep_all", "ceiling_no_gemm_rerun",
                                                    "estimate_rebalanced_only", "estimate_with_headroom",
                                                    "no_gemm_rerun_share_with_headroom", "max_batch_head_bound")}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({k: _finite(v) for k, v in results.items()}, indent=1) + "\n")
    print(f"wrote {args.out}")


def _finite(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return "inf" if isinstance(value, float) and math.isinf(value) else value


if __name__ == "__main__":
    main()
