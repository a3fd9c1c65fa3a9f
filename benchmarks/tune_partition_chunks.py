"""The ``balanced`` partitioner on multi-chunk schedules: the refinement from the stage min-max alone
(the rule before) against the rule now (the refinement from equal chunks too, the faster of the
two in simulation: :func:`mindpipe.tuner.partition.balanced_candidates`), in simulated iteration time.

For each setup, plans with several chunks per rank (``interleaved_1f1b``, ``zbv``, ``dualpipev``)
are drawn from the tuner's search space (seed 0), each partitioned both ways (the same memory caps
as the tuner's) and simulated; plans where both rules give the same partition are counted, not
compared. Prints and writes ``benchmarks/results/tune_partition_chunks.json``; about a minute.

    .venv/bin/python benchmarks/tune_partition_chunks.py [--per-setup N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import block_policies
from mindpipe.tuner.keys import parse_fixes, plan_of
from mindpipe.tuner.materialize import Problem, materialize
from mindpipe.tuner.partition import balanced_partition
from mindpipe.tuner.space import SearchSpace

OUT = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "tune_partition_chunks.json"
SETUPS = [("gpt-13b", "a100-sxm4-80gb:8x8", 128, []), ("llama3-70b", "h100-sxm5-80gb:8x8", 128, ["flash_attention=true"]),
          ("gpt3-175b", "a100-sxm4-80gb:16x8", 512, [])]


def previous_rule(problem: Problem, sim: Any, point: dict[str, Any]) -> list[int]:
    """The partition ``balanced`` gave before: the descent from the stage min-max only (the first candidate)."""
    plan = plan_of(point)
    costs = sim.layer_costs(plan)
    policies = block_policies(plan, problem.gpt.num_layers)
    caps = sim.block_caps(plan) if problem.memory_caps else None
    s2r = sim.schedule(plan).stage_to_rank
    try:
        return balanced_partition(costs, plan.num_stages, policies, s2r, caps)
    except ContractError:  # no split under the caps: time alone, as the tuner does
        return balanced_partition(costs, plan.num_stages, policies, s2r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-setup", type=int, default=40)
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows, summary = [], {}
    for model_name, cluster_name, batch, fixes in SETUPS:
        model, cluster = load_model(model_name), load_cluster(cluster_name)
        space = SearchSpace(model, cluster, [batch], parse_fixes(fixes))
        multi = [p for p in space.points if p["schedule"] in ("interleaved_1f1b", "zbv", "dualpipev") and p["pp"] > 1]
        sample = random.Random(0).sample(multi, min(args.per_setup, len(multi)))
        problem = Problem(model, cluster, None, None)
        sim = problem.simulator()
        ratios, same, t_eval = [], 0, 0.0
        for point in sample:
            t1 = time.perf_counter()
            now = materialize(problem, point, sim).plan
            t_eval += time.perf_counter() - t1
            before = dataclasses.replace(now, partition=previous_rule(problem, sim, point))
            if before.partition == now.partition:
                same += 1
                continue
            t_now, t_before = sim.run(now).iteration_time_s, sim.run(before).iteration_time_s
            ratios.append(t_now / t_before)
            rows.append({"model": model_name, "cluster": cluster_name, "point": point, "before": before.partition,
                         "now": now.partition, "before_s": t_before, "now_s": t_now})
        summary[model_name] = {"cluster": cluster_name, "plans": len(sample), "same_partition": same,
                               "compared": len(ratios),
                               "median_time_ratio_now_over_before": statistics.median(ratios) if ratios else None,
                               "best_ratio": min(ratios) if ratios else None, "worst_ratio": max(ratios) if ratios else None,
                               "slower_now": sum(r > 1 + 1e-9 for r in ratios),
                               "materialize_s_per_plan": t_eval / max(1, len(sample))}
        print(model_name, json.dumps(summary[model_name]))
    OUT.write_text(json.dumps({"command": ".venv/bin/python benchmarks/tune_partition_chunks.py", "summary": summary,
                               "rows": rows, "wall_s": time.perf_counter() - t0}, indent=1) + "\n")
    print(f"wrote {OUT} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
