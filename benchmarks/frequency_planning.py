"""SM clocks on GPT-3 175B and 18.4B / A100 (vTrain's multi-node shapes): Perseus per stage and per action vs EnvPipe.

For each configuration: the engine-simulated iteration time and GPU energy at default clocks, the
min-energy Perseus frontier point within 1 % longer iterations (one clock per rank, what the
executor locks), EnvPipe's heuristic at the same envelope, and per-action clocks
(``perseus_action``: a clock per forward/backward of each micro-batch, as Perseus plans; the
executor switches it around every action), all re-simulated by the engine. Each row also
carries three upper bounds on the saving of any clock plan within 1 % on the DAG's energy model:
the exact time–cost LP optimum (:func:`mindpipe.tuner.clock_actions.lp_plan`) and the looser
rank-window and free-time bounds (:func:`mindpipe.tuner.clock_actions.energy_bound`). Writes ``benchmarks/results/frequency_planning.json`` and
``benchmarks/results/frequency_planning.png`` (the frontiers). The issue's target is >= 15 % GPU energy
saved at <= 1 % slowdown; the JSON states per configuration and method whether it is met.
The configurations are vTrain's, not Perseus's or EnvPipe's (their per-workload setups were not
retrievable here); they are the ones this benchmark ran before per-action clocks were added.

    python benchmarks/frequency_planning.py [--out DIR] [--stride 1] [--quick] [--knee-mhz N]

``--knee-mhz N`` is a sensitivity run, not the model: the power model's voltage floor (the
estimated ``base_sm_clock_MHz`` of ``frequency.json``) moved to N MHz; it writes
``frequency_planning_knee{N}.json`` and leaves the headline files alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from mindpipe.simulator.frequency import PowerModel
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.builtin import load_model
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.tuner.frequency import ClockPlan, clock_grid, plan_clocks

TARGET_SAVING = 0.15
MAX_SLOWDOWN = 0.01
# vTrain multi-node rows (175B, 512 A100, gbs 1536, mbs 2, seq 2048, fp16, full recompute, 1F1B);
# the interleaved row uses the same mesh with two chunks per rank.
GPT3_175B = {"mbs": 2, "gbs": 1536, "nodes": 64}
# vTrain's GPT-3-class 18.4B rows (256 A100, gbs 1024): 40 layers, hidden 6144, 48 heads.
GPT_18B = {"mbs": 8, "gbs": 1024, "nodes": 32,
           "model": {"kind": "gpt", "num_layers": 40, "hidden_size": 6144, "num_heads": 48, "seq_len": 2048,
                     "vocab_size": 51200, "name": "gpt-18.4b"}}
CONFIGS: list[dict[str, Any]] = [
    {"name": "175B tp8 dp4 pp16 1f1b", **GPT3_175B, "plan": {"tp": 8, "dp": 4, "pp": 16, "schedule": "1f1b"}},
    {"name": "175B tp4 dp4 pp32 1f1b", **GPT3_175B, "plan": {"tp": 4, "dp": 4, "pp": 32, "schedule": "1f1b"}},
    {"name": "175B tp8 dp4 pp16 interleaved", **GPT3_175B,
     "plan": {"tp": 8, "dp": 4, "pp": 16, "schedule": "interleaved_1f1b", "virtual_stages": 2}},
    {"name": "18.4B tp8 dp4 pp8 1f1b", **GPT_18B, "plan": {"tp": 8, "dp": 4, "pp": 8, "schedule": "1f1b"}},
    {"name": "18.4B tp8 dp4 pp8 interleaved", **GPT_18B,
     "plan": {"tp": 8, "dp": 4, "pp": 8, "schedule": "interleaved_1f1b", "virtual_stages": 2}},
]


def run_config(sim: Simulator, cfg: dict, stride: int) -> tuple[dict, list[ClockPlan]]:
    """Both planners on one configuration; returns the JSON row and the clock plans."""
    plan = Plan(micro_batch_size=cfg["mbs"], global_batch_size=cfg["gbs"], recompute="full", precision="fp16",
                **cfg["plan"])
    row: dict = {"name": cfg["name"], "plan": {**cfg["plan"], "micro_batch_size": cfg["mbs"],
                                               "global_batch_size": cfg["gbs"]},
                 "devices": cfg["nodes"] * 8, "num_microbatches": plan.num_microbatches}
    plans = []
    for method in ("perseus", "envpipe", "perseus_action"):
        t0 = time.perf_counter()
        cp = plan_clocks(sim, plan, method, MAX_SLOWDOWN, stride)
        info = cp.to_dict()
        info["planner_wall_s"] = time.perf_counter() - t0
        info["frontier_points"] = len(info.pop("frontier"))
        if cp.frontier:
            # How much longer an iteration the frontier needs for the target saving (DAG figures).
            f0 = cp.frontier[0]
            hit = [p.iteration_s for p in cp.frontier if p.energy_j <= (1 - TARGET_SAVING) * f0.energy_j]
            info["frontier_slowdown_for_target"] = min(hit) / f0.iteration_s - 1 if hit else None
        info["meets_target"] = cp.energy_saving >= TARGET_SAVING and cp.slowdown <= MAX_SLOWDOWN
        row[method] = info
        plans.append(cp)
        if cp.bounds:
            row["bounds"] = cp.bounds
        print(f"{cfg['name']:32s} {method:14s} saving {cp.energy_saving:6.1%} at {cp.slowdown:+.2%} "
              f"({info['planner_wall_s']:.0f} s)" + (f"; no plan saves more than {cp.bounds['lp_exact']:.1%}"
                                                     if "lp_exact" in cp.bounds else ""), flush=True)
    base = sim.run(plan)
    row["baseline"] = {"iteration_s": base.iteration_time_s, "device_energy_j": base.extra.device_energy_j,
                       "bubble_fraction": base.bubble_fraction}
    # The slope near the top clock: every rank one clock step down (engine).
    step = clock_grid(sim)[1]
    one = sim.run(dataclasses.replace(plan, stage_clocks_mhz=[step] * plan.num_stages))
    row["all_ranks_one_step_down"] = {"mhz": step, "slowdown": one.iteration_time_s / base.iteration_time_s - 1,
                                      "energy_saving": 1 - one.extra.device_energy_j / base.extra.device_energy_j}
    return row, plans


def plot(results: list[tuple[str, list[ClockPlan]]], path: Path) -> None:
    """One panel per configuration: frontier, baseline, Perseus and EnvPipe points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = -(-len(results) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[len(results):]:
        ax.set_visible(False)
    for ax, (name, (perseus, envpipe, action)) in zip(axes.flat, results, strict=False):
        t0, e0 = perseus.baseline_s, perseus.baseline_energy_j
        ax.plot([p.iteration_s / t0 for p in perseus.frontier], [p.energy_j / e0 for p in perseus.frontier], ".-",
                ms=3, label="Perseus frontier (DAG)")
        ax.plot([1], [1], "ks", label="default clocks")
        ax.plot([perseus.iteration_s / t0], [perseus.energy_j / e0], "r*", ms=12, label="Perseus, engine")
        ax.plot([envpipe.iteration_s / t0], [envpipe.energy_j / e0], "g^", ms=8, label="EnvPipe, engine")
        ax.plot([action.iteration_s / t0], [action.energy_j / e0], "mD", ms=7, label="Perseus per action, engine")
        if "lp_exact" in action.bounds:
            ax.axhline(1 - action.bounds["lp_exact"], color="m", ls=":", lw=0.8, label="LP bound, any plan within 1 %")
        ax.axvline(1 + MAX_SLOWDOWN, color="grey", ls=":")
        ax.axhline(1 - TARGET_SAVING, color="grey", ls="--", lw=0.8)
        ax.set_xlim(0.995, 1.10)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("iteration time / default")
        ax.set_ylabel("GPU energy / default")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"),
                    help="directory for the JSON and the plot (default: benchmarks/results)")
    ap.add_argument("--stride", type=int, default=1, help="clock steps per planner step (1 = every 15 MHz)")
    ap.add_argument("--quick", action="store_true", help="only the first configuration")
    ap.add_argument("--knee-mhz", type=int, default=None,
                    help="sensitivity: put the power model's voltage floor at this clock instead of the base clock")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, panels = [], []
    for cfg in CONFIGS[:1] if args.quick else CONFIGS:
        model = Model(**cfg["model"]) if "model" in cfg else load_model("gpt3-175b")
        sim = Simulator(model, Cluster(gpu="a100-sxm4-80gb", num_nodes=cfg["nodes"], gpus_per_node=8))
        if args.knee_mhz is not None and sim.power is not None:
            spec = dataclasses.replace(sim.power.spec, base_sm_clock_MHz=args.knee_mhz)
            sim.power = PowerModel(spec, sim.power.max_power_W)
        row, plans = run_config(sim, cfg, args.stride)
        rows.append(row)
        panels.append((cfg["name"], plans))
    doc = {"device": "a100-sxm4-80gb", "max_slowdown": MAX_SLOWDOWN,
           "target_energy_saving": TARGET_SAVING, "clock_stride_steps": args.stride,
           "power_model": "simulator/frequency.py with traces/hardware/frequency.json (knee and memory-power "
                          "fractions are estimates)",
           "methods": {"perseus": "stage_clocks_mhz, one locked clock per rank (executor runs it)",
                       "envpipe": "stage_clocks_mhz by EnvPipe's bubble-slack heuristic (executor runs it)",
                       "perseus_action": "action_clocks_mhz, a clock per forward/backward of each micro-batch "
                                         "(executor switches it between actions)"},
           "bounds": {"lp_exact": "the time-cost LP optimum with each action's clock options relaxed to their convex "
                                  "hull: no clock plan (per stage or per action) within the slowdown saves more",
                      "rank_window": "upper bound on the saving of any clock plan (per stage or per action) within "
                                     "the slowdown: each rank's actions fit between its earliest first start and "
                                     "latest last finish",
                      "free_time": "saving if every action ran at its least-energy clock at no cost in time"},
           "configs": rows}
    stem = "frequency_planning" if args.knee_mhz is None else f"frequency_planning_knee{args.knee_mhz}"
    if args.knee_mhz is not None:
        doc["sensitivity"] = (f"NOT the shipped model: voltage floor of the power model at {args.knee_mhz} MHz instead "
                              "of the base clock (an estimate in frequency.json)")
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(panels, out / f"{stem}.png")
    print(f"wrote {out / f'{stem}.json'} and {out / f'{stem}.png'}")


if __name__ == "__main__":
    main()
