"""What ``mindpipe tune --out DIR`` writes besides the sweep state.

* ``evaluations.csv`` / ``evaluations.parquet``: one row per evaluated point — the plan keys, its
  partition, status and reason, every metric, the objective value;
* ``best_plan.json``: the best feasible plan (a Plan document ``mindpipe run`` and ``mindpipe
  simulate`` accept), ``best.json`` its metrics;
* ``pareto.csv``: the feasible plans no other beats on both throughput and carbon per sample;
* ``convergence.png`` (best value so far vs. simulations) and ``pareto.png``;
* ``summary.json``: what ``--json`` prints.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from mindpipe.traces.config import Plan
from mindpipe.traces.schema import from_dict, write_json
from mindpipe.tuner.objectives import Objective, pareto_front
from mindpipe.tuner.space import POINT_KEYS
from mindpipe.tuner.sweep import SweepResult

METRIC_COLUMNS = (
    "iteration_time_s", "throughput_samples_per_s", "throughput_tokens_per_s", "goodput_samples_per_s",
    "statistical_efficiency", "tflops_per_gpu", "mfu", "bubble_fraction", "exposed_dp_comm_s", "peak_memory_gib",
    "energy_j", "energy_per_sample_j", "carbon_gco2", "carbon_per_sample_g",
)


def rows(result: SweepResult) -> list[dict[str, Any]]:
    """Flat table rows, one per evaluated point, in evaluation order."""
    out = []
    for r in result.records:
        plan = r.get("plan") or {}
        row: dict[str, Any] = {"index": r["index"], "status": r["status"], "feasible": r["feasible"],
                               "reason": r["reason"], "value": r["value"], "simulated": bool(r.get("simulated"))}
        row.update({k: r["point"][k] for k in POINT_KEYS})
        row["partition"] = json.dumps(plan.get("partition")) if plan.get("partition") is not None else ""
        row.update({k: r["metrics"].get(k) for k in METRIC_COLUMNS})
        row["message"] = (r.get("message") or "").splitlines()[0] if r.get("message") else ""
        row["eval_s"] = r.get("eval_s")
        out.append(row)
    return out


def write_tables(table: list[dict[str, Any]], out: Path) -> list[Path]:
    """``evaluations.csv`` and ``evaluations.parquet``."""
    import pandas as pd

    df = pd.DataFrame(table, columns=["index", "status", "feasible", "reason", "value", "simulated", *POINT_KEYS,
                                      "partition", *METRIC_COLUMNS, "message", "eval_s"])
    for col in ("value", *METRIC_COLUMNS, "eval_s"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    csv, parquet = out / "evaluations.csv", out / "evaluations.parquet"
    df.to_csv(csv, index=False)
    df.to_parquet(parquet, index=False)
    return [csv, parquet]


def pareto_rows(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Feasible rows on the throughput-vs-carbon-per-sample front."""
    feasible = [r for r in table if r["feasible"]]
    return [feasible[i] for i in pareto_front(feasible)]


def _plot_convergence(result: SweepResult, objective: Objective, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs, ys, best, sims = [], [], None, 0
    each_x, each_y = [], []
    for r in result.records:
        sims += bool(r.get("simulated"))
        if r["feasible"]:
            each_x.append(sims)
            each_y.append(r["value"])
            if best is None or objective.better(r["value"], best):
                best = r["value"]
        if best is not None and r.get("simulated"):
            xs.append(sims)
            ys.append(best)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(each_x, each_y, s=8, color="0.6", label="feasible plan evaluated")
    ax.step(xs, ys, where="post", label="best so far")
    ax.legend(fontsize=8)
    ax.set_xlabel("simulations")
    ax.set_ylabel(f"{objective.name} ({objective.unit})")
    ax.set_title(f"convergence: {objective.describe()}", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_pareto(table: list[dict[str, Any]], front: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    feas = [r for r in table if r["feasible"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([r["carbon_per_sample_g"] for r in feas], [r["throughput_samples_per_s"] for r in feas], s=10,
               alpha=0.5, label="feasible plans")
    ax.plot([r["carbon_per_sample_g"] for r in front], [r["throughput_samples_per_s"] for r in front], "o-",
            color="C3", label="Pareto front")
    ax.set_xlabel("carbon per sample (gCO2eq)")
    ax.set_ylabel("throughput (samples/s)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def summary(result: SweepResult, objective: Objective, space_info: dict[str, Any], out: Path,
            pareto_count: int) -> dict[str, Any]:
    """The ``--json`` summary object."""
    best = result.best
    infeasible = dict(result.infeasible)
    rules = space_info["rejected"]
    if rules:
        infeasible["rules"] = rules
    return {
        "objective": objective.describe(),
        "best_plan": best["plan"] if best else None,
        "best_value": best["value"] if best else None,
        "best_metrics": {k: _finite(best["metrics"].get(k)) for k in METRIC_COLUMNS} if best else None,
        "evaluations": result.simulations,
        "evaluated_points": len(result.records),
        "reused": result.reused,
        "infeasible": sum(infeasible.values()),
        "infeasible_by_reason": infeasible,
        "space_size": space_info["size"],
        "pareto_points": pareto_count,
        "out": str(out),
    }


def write_outputs(result: SweepResult, objective: Objective, space_info: dict[str, Any], out: Path,
                  plots: bool = True) -> dict[str, Any]:
    """Write every output file and return the summary."""
    table = rows(result)
    write_tables(table, out)
    front = pareto_rows(table)
    import pandas as pd

    pd.DataFrame(front, columns=list(table[0]) if table else None).to_csv(out / "pareto.csv", index=False)
    if result.best is not None:
        plan = from_dict(Plan, result.best["plan"], "best plan")  # validate before handing it on
        write_json(plan, out / "best_plan.json")
        (out / "best.json").write_text(json.dumps({k: result.best[k] for k in ("point", "plan", "metrics", "value")},
                                                  indent=1, default=str) + "\n", encoding="utf-8")
    if plots and table:
        _plot_convergence(result, objective, out / "convergence.png")
        _plot_pareto(table, front, out / "pareto.png")
    info = summary(result, objective, space_info, out, len(front))
    (out / "summary.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return info


__all__ = ["METRIC_COLUMNS", "pareto_rows", "rows", "summary", "write_outputs", "write_tables"]
