"""Executor overhead: ``mindpipe run`` vs a minimal hand-written pipelining script (issues 5 and 14).

Trains ``gpt-mini`` with pp=2 and the 1F1B schedule on this machine, with the executor
(``mindpipe run``, torch's ``Schedule1F1B``, all measurement hooks on) and with
``benchmarks/executor_handwritten_pp.py`` (the same model, batch, schedule and optimizer, nothing
else); a step's time is the slowest rank's wall time. The two alternate for ``--rounds`` rounds
(hand-written, executor, hand-written, executor …) so that drift in the machine's speed falls on
both alike. The figure is the executor's step-time ratio with a 95 % interval
(``benchmarks/overhead_stats.py``): per round the ratio of medians of the post-warm-up steps,
their geometric mean, and a seeded bootstrap over rounds. The acceptance (issue 14) is an
interval whose upper end is ≤ 1.05, from at least 6 rounds. Writes
``benchmarks/results/executor_overhead.json`` (with the machine's load average before and after:
other load widens the interval).

    .venv/bin/python benchmarks/executor_overhead.py [--rounds 8] [--steps 30] [--warmup 5] [--micro-batch-size 2] [--global-batch-size 16] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from mindpipe.executor.launch import free_port
from mindpipe.traces.host_alloc import set_rank_allocator
from mindpipe.traces.trace import Trace
from overhead_stats import ratio_interval  # a sibling script module: benchmarks/ is on sys.path as the script's folder

HERE = Path(__file__).resolve().parent
TARGET = 1.05
MIN_ROUNDS = 6


def run_executor(model: str, mbs: int, gbs: int, steps: int, tmp: Path, env: dict[str, str]) -> list[float]:
    plan = json.dumps({"pp": 2, "micro_batch_size": mbs, "global_batch_size": gbs, "schedule": "1f1b", "precision": "fp32"})
    out = tmp / "measured.json"
    cmd = [sys.executable, "-m", "mindpipe.cli", "run", plan, "--nproc", "2", "--steps", str(steps), "--model", model,
           "--schedule-source", "torch", "--out", str(out), "--warmup-steps", "0"]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    m = Trace.load(out).measurement
    if m is None:
        raise RuntimeError("the executor wrote no measurement")
    return [s.iteration_s for s in m.steps]


def run_handwritten(model: str, mbs: int, gbs: int, steps: int, tmp: Path, env: dict[str, str]) -> list[float]:
    out = tmp / "handwritten.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(HERE / "executor_handwritten_pp.py"), model, str(mbs), str(gbs),
           str(steps), str(out)]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return list(json.loads(out.read_text())["step_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-mini")
    ap.add_argument("--rounds", type=int, default=8,
                    help=f"alternating hand-written/executor runs of each (the acceptance needs >= {MIN_ROUNDS})")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--global-batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    ap.add_argument("--out", default=str(HERE / "results" / "executor_overhead.json"))
    args = ap.parse_args()
    if args.rounds < 2 or args.steps <= args.warmup:
        ap.error("need --rounds >= 2 (a bootstrap over rounds) and --steps > --warmup")
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env["PYTHONPATH"] = str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")
    set_rank_allocator(env)  # the hand-written script's ranks get the allocator the executor's get
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        common = (args.model, args.micro_batch_size, args.global_batch_size, args.steps, tmp, env)
        hand_runs, exec_runs = [], []
        for k in range(args.rounds):
            hand_runs.append(run_handwritten(*common))
            exec_runs.append(run_executor(*common))
            print(f"round {k + 1}/{args.rounds}: hand-written {statistics.median(hand_runs[-1][args.warmup:]) * 1e3:.2f} "
                  f"ms/step, executor {statistics.median(exec_runs[-1][args.warmup:]) * 1e3:.2f} ms/step", flush=True)
    est = ratio_interval(hand_runs, exec_runs, args.warmup, seed=args.seed)
    result = {
        "benchmark": "executor_overhead",
        "command": " ".join([Path(sys.executable).name, "benchmarks/executor_overhead.py", *sys.argv[1:]]),
        "model": args.model, "pp": 2, "schedule": "1f1b", "micro_batch_size": args.micro_batch_size,
        "global_batch_size": args.global_batch_size, "steps": args.steps, "warmup_steps": args.warmup,
        "rounds": args.rounds,
        "ratio": est.ratio, "interval_low": est.low, "interval_high": est.high, "confidence": est.confidence,
        "estimator": ("per round: median post-warm-up step time, executor over hand-written; point: geometric "
                      "mean over rounds; interval: percentile bootstrap over rounds at Hesterberg's expanded tails "
                      "(benchmarks/overhead_stats.py)"),
        "bootstrap_resamples": est.resamples, "bootstrap_seed": est.seed,
        "per_round_ratio": est.per_round,
        "handwritten_median_step_s": [statistics.median(h[args.warmup:]) for h in hand_runs],
        "executor_median_step_s": [statistics.median(e[args.warmup:]) for e in exec_runs],
        "target_interval_high": TARGET, "within_target": est.high <= TARGET,
        "enough_rounds_for_acceptance": args.rounds >= MIN_ROUNDS,
        "load_average_1m_before": load_before[0], "load_average_1m_after": os.getloadavg()[0],
        "handwritten_step_s": hand_runs, "executor_step_s": exec_runs,
        "torch": torch.__version__, "cpus": os.cpu_count(), "omp_num_threads": env["OMP_NUM_THREADS"],
        "machine": platform.machine(), "python": platform.python_version(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    verdict = "within" if est.high <= TARGET else "NOT within"
    note = "" if args.rounds >= MIN_ROUNDS else f" (only {args.rounds} rounds: the acceptance needs {MIN_ROUNDS})"
    print(f"executor/hand-written step time: {est.ratio:.3f}, 95 % interval [{est.low:.3f}, {est.high:.3f}] over "
          f"{args.rounds} rounds; {verdict} the target (upper end <= {TARGET}){note} -> {args.out}")


if __name__ == "__main__":
    main()
