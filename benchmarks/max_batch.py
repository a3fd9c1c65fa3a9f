"""Maximum trainable batch per planner, and the tuner with memory planning (issue 16, points 1 and 3).

Simulated, on published-size setups (every figure from the simulator's memory and event models):

* (i) a GPT-2-XL-sized model (48 blocks, hidden 1600, 25 heads, sequence 1024, vocabulary 50,257;
  Radford et al. 2019) on 8 × A100-40GB, pp = 8;
* (i-b) ``gpt-13b`` on 8 × A100-40GB, pp = 8;
* (ii) ``gpt3-175b`` on 1,024 × A100-40GB, tp = 8 with sequence parallelism, pp = 16, dp = 8 with
  ZeRO-1 (on 128 devices with dp = 1 no memory-blind plan fits one sample per micro-batch).

For each planner (``even``, ``pipedream``, ``vpipe``, ``dawnpiper``): the largest global batch that
fits at m = pp micro-batches (:mod:`mindpipe.tuner.maxbatch`), the throughput there, and the
throughput at ``vpipe``'s and at ``pipedream``'s maximum batch. Issue 16's targets: ``dawnpiper``
≥ 4× ``pipedream`` and ≥ 1.5× ``vpipe`` in maximum batch, and ≥ 1.2× ``vpipe``'s throughput at
``vpipe``'s maximum batch. Every figure is reported, met or not. Each table is made with three
losses, the same for every planner (``LOSSES``): torch's cross-entropy, the loss upcast in 16
pieces (``loss_chunks``), and the LM head fused into those pieces (``fused_head_loss``).

Tuner check: ``mindpipe tune`` for gpt3-175b on 1,024 A100-40GB (global batch 1536, tp = 8 without
sequence parallelism, so that keeping every activation does not always fit; ZeRO-1, 1F1B;
pp ∈ {8, 16, 32}, micro-batch ∈ {1, 2, 4}, grid over the whole space): the best plan with memory planning (``vpipe``, ``dawnpiper``) against the best plan with
one recompute setting for all layers (``balanced``, recompute none / selective / full), and the ratio.

Run from the repository root (a few minutes on 2 cores)::

    .venv/bin/python benchmarks/max_batch.py

Writes ``benchmarks/results/max_batch.json`` (tables ``planners``, ``planners_loss_chunks_16``,
``planners_fused_head_loss_16``) and ``benchmarks/results/max_batch.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.config import LAYER_MEMORY_POLICIES, Model
from mindpipe.tuner.api import tune
from mindpipe.tuner.materialize import Problem
from mindpipe.tuner.maxbatch import base_point, ratio, row, search, throughput_at
from mindpipe.tuner.sweep import SweepConfig

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results" / "max_batch.json"
PLANNERS = ("even", "pipedream", "vpipe", "dawnpiper")
# Every table is made three times: with torch's cross-entropy, whose fp32 log-softmax and backward
# gradients are the last stage's largest tensors at a 50k vocabulary; with the loss upcast in
# pieces (plan key ``loss_chunks``); and with the LM head's GEMM fused into those pieces (plan key
# ``fused_head_loss``: no logits kept; vocabulary-parallel under TP). The same loss for every
# planner of a table.
LOSS_CHUNKS = 16
LOSSES: dict[str, dict[str, Any]] = {
    "torch's cross-entropy": {},
    f"loss_chunks={LOSS_CHUNKS}": {"loss_chunks": LOSS_CHUNKS},
    f"fused_head_loss, loss_chunks={LOSS_CHUNKS}": {"loss_chunks": LOSS_CHUNKS, "fused_head_loss": True},
}
GPT2_XL = Model(kind="gpt", num_layers=48, hidden_size=1600, num_heads=25, seq_len=1024, vocab_size=50257,
                name="gpt2-xl-shape")
SETUPS: dict[str, tuple[Model | str, str, dict[str, Any]]] = {
    "gpt2-xl on 8 x A100-40GB, pp=8": (GPT2_XL, "a100-sxm4-40gb:1x8", {"dp": 1, "tp": 1, "pp": 8}),
    "gpt-13b on 8 x A100-40GB, pp=8": ("gpt-13b", "a100-sxm4-40gb:1x8", {"dp": 1, "tp": 1, "pp": 8}),
    "gpt3-175b on 1024 x A100-40GB, tp=8 sp, pp=16, dp=8 ZeRO-1": (
        "gpt3-175b", "a100-sxm4-40gb:128x8",
        {"dp": 8, "tp": 8, "pp": 16, "sequence_parallel": True, "zero_stage": 1}),
}


def planner_table(model: Model | str, cluster: str, fixes: dict[str, Any]) -> dict[str, Any]:
    """Max batch, throughput there and at vpipe's / pipedream's max batch, per planner."""
    problem = Problem(load_model(model), load_cluster(cluster))
    rows: dict[str, dict[str, Any]] = {}
    for name in PLANNERS:
        t0 = time.perf_counter()
        rows[name] = row(search(problem, fixes, name)[0])
        rows[name]["search_s"] = round(time.perf_counter() - t0, 2)
    m = fixes["pp"]
    for ref in ("vpipe", "pipedream"):
        mbs = rows[ref]["micro_batch_size"]
        for name in PLANNERS:
            base = base_point(fixes["dp"], fixes["tp"], fixes["pp"], name, fixes)
            rows[name][f"throughput_at_{ref}_max"] = throughput_at(problem, base, mbs, m) if mbs else None
    dawn, vp, pd = rows["dawnpiper"], rows["vpipe"], rows["pipedream"]
    ratios = {
        "dawnpiper_over_pipedream_max_batch": ratio(dawn["global_batch_size"], pd["global_batch_size"]),
        "dawnpiper_over_vpipe_max_batch": ratio(dawn["global_batch_size"], vp["global_batch_size"]),
        "dawnpiper_over_vpipe_throughput_at_vpipe_max": ratio(dawn["throughput_at_vpipe_max"],
                                                              vp["throughput_at_vpipe_max"]),
        "vpipe_over_pipedream_max_batch": ratio(vp["global_batch_size"], pd["global_batch_size"]),
    }
    targets = {"dawnpiper >= 4x pipedream": _met(ratios["dawnpiper_over_pipedream_max_batch"], 4.0),
               "dawnpiper >= 1.5x vpipe": _met(ratios["dawnpiper_over_vpipe_max_batch"], 1.5),
               "dawnpiper >= 1.2x vpipe throughput at vpipe's max": _met(
                   ratios["dawnpiper_over_vpipe_throughput_at_vpipe_max"], 1.2)}
    return {"rows": rows, "ratios": {k: _num(v) for k, v in ratios.items()}, "targets_met": targets}


def _met(value: float | None, target: float) -> bool | None:
    return None if value is None else value >= target


def _num(value: float | None) -> float | str | None:
    """JSON-safe: inf as the string "inf" (the baseline fits nothing)."""
    return "inf" if value is not None and math.isinf(value) else value


def tuner_check(work: Path, budget: int) -> dict[str, Any]:
    """The tuner's best gpt3-175b plan on 1,024 A100-40GB with and without memory planning."""
    fixes = ["tp=8", "sequence_parallel=false", "zero_stage=1", "schedule=1f1b", "pp=8,16,32", "micro_batch_size=1,2,4"]
    out: dict[str, Any] = {}
    for label, parts, extra in (("one recompute setting (balanced)", ["balanced"], ["recompute=none,selective,full"]),
                                ("memory planning (vpipe, dawnpiper)", ["vpipe", "dawnpiper"], [])):
        t0 = time.perf_counter()
        outcome = tune("gpt3-175b", "a100-sxm4-40gb:128x8", out=work / label.split()[0], global_batch=1536,
                       fixes=fixes + extra, partitioners=parts,
                       config=SweepConfig(optimizer="grid", budget=budget, workers=1), plots=False)
        info = outcome.summary.to_dict()
        plan = info["best_plan"]
        policy = plan.get("layer_memory_policy")
        out[label] = {"throughput_samples_per_s": info["best_value"], "evaluations": info["evaluations"],
                      "space_size": info["space_size"], "infeasible": info["infeasible"],
                      "best_plan": {k: plan.get(k) for k in ("dp", "tp", "pp", "micro_batch_size", "recompute",
                                                             "partition", "stage_cuts", "swap_copy_back")},
                      "policy_counts": {p: policy.count(p) for p in LAYER_MEMORY_POLICIES} if policy else None,
                      "seconds": round(time.perf_counter() - t0, 1)}
    a, b = (out[k]["throughput_samples_per_s"] for k in out)
    out["ratio_memory_planning_over_one_setting"] = b / a
    out["target_met (>= 1.0)"] = b / a >= 1.0
    return out


def plot(tables: dict[str, dict[str, Any]], path: Path) -> None:
    """Max batch (log) and throughput at the max batch per planner and setup, one row per loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(len(tables), 2, figsize=(12, 4.2 * len(tables)), squeeze=False)
    width = 0.8 / len(PLANNERS)
    for axes, (title, results) in zip(grid, tables.items(), strict=True):
        setups = list(results)
        for k, name in enumerate(PLANNERS):
            xs = [i + (k - 1.5) * width for i in range(len(setups))]
            batch = [max(results[s]["rows"][name]["global_batch_size"], 0.5) for s in setups]
            thr = [results[s]["rows"][name]["throughput_samples_per_s"] or 0.0 for s in setups]
            axes[0].bar(xs, batch, width, label=name)
            axes[1].bar(xs, thr, width, label=name)
        axes[0].set_yscale("log")
        axes[0].set_ylabel("max global batch (m = pp; 0.5: none fits)")
        axes[1].set_ylabel("simulated samples/s at the max batch")
        for ax in axes:
            ax.set_title(title, fontsize=10)
            ax.set_xticks(range(len(setups)))
            ax.set_xticklabels([s.split(",")[0].replace(" on ", "\n") for s in setups], fontsize=8)
            ax.legend(fontsize=8)
    fig.suptitle("Maximum trainable batch per planner (simulated)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--skip-tuner", action="store_true", help="only the planner tables")
    parser.add_argument("--only-tuner", action="store_true", help="only the tuner check")
    parser.add_argument("--budget", type=int, default=200, help="grid evaluations per tuner run (the whole space)")
    args = parser.parse_args()
    tables: dict[str, dict[str, Any]] = {loss: {} for loss in LOSSES}
    for label, (model, cluster, fixes) in ({} if args.only_tuner else SETUPS).items():
        for loss, extra in LOSSES.items():
            table = tables[loss]
            table[label] = planner_table(model, cluster, {**fixes, **extra})
            print(f"{label} [{loss}]", json.dumps(table[label]["ratios"]), json.dumps(table[label]["targets_met"]), flush=True)
            for name, r in table[label]["rows"].items():
                print(f"  {name:10s} max batch {r['global_batch_size']:6d} (mbs {r['micro_batch_size']}) "
                      f"thr {r['throughput_samples_per_s']} at-vpipe-max {r['throughput_at_vpipe_max']} "
                      f"partition {r['partition']} cuts {r['stage_cuts']} copy back {r['swap_copy_back']} "
                      f"policies {r['policy_counts']} "
                      f"[{r['search_s']} s]", flush=True)
    results = tables["torch's cross-entropy"]
    payload: dict[str, Any] = {"planners": results, f"planners_loss_chunks_{LOSS_CHUNKS}": tables[f"loss_chunks={LOSS_CHUNKS}"],
                               f"planners_fused_head_loss_{LOSS_CHUNKS}": tables[f"fused_head_loss, loss_chunks={LOSS_CHUNKS}"],
                               "microbatches": "pp (the fewest that fill a 1F1B pipeline)"}
    if not args.skip_tuner:
        with tempfile.TemporaryDirectory() as tmp:
            payload["tuner_check"] = tuner_check(Path(tmp), args.budget)
        print(json.dumps(payload["tuner_check"], indent=1), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1) + "\n")
    if results:
        plot({loss: t for loss, t in tables.items() if t}, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
