"""Executor overhead: ``mindpipe run`` vs a minimal hand-written pipelining script (issue 5).

Trains ``gpt-mini`` with pp=2 and the 1F1B schedule twice on this machine — once with the
executor (``mindpipe run``, torch's ``Schedule1F1B``, all measurement hooks on) and once with
``benchmarks/executor_handwritten_pp.py`` (the same model, batch, schedule and optimizer, nothing
else) — and compares the median step time after warm-up (per step, the slowest rank's wall time).
The two alternate for ``--rounds`` rounds (hand-written, executor, hand-written, executor …) so
that drift in the machine's speed falls on both alike; the ratio is of the medians over all
rounds' post-warm-up steps. The acceptance target is a ratio within 1.05. Writes
``benchmarks/results/executor_overhead.json``.

    .venv/bin/python benchmarks/executor_overhead.py [--rounds 2] [--steps 30] [--warmup 5] [--micro-batch-size 2] [--global-batch-size 16]
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
from mindpipe.traces.trace import Trace

HERE = Path(__file__).resolve().parent


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
    ap.add_argument("--rounds", type=int, default=2, help="alternating hand-written/executor runs of each")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--global-batch-size", type=int, default=16)
    ap.add_argument("--out", default=str(HERE / "results" / "executor_overhead.json"))
    args = ap.parse_args()
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env["PYTHONPATH"] = str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        common = (args.model, args.micro_batch_size, args.global_batch_size, args.steps, tmp, env)
        hand_runs, exec_runs = [], []
        for _ in range(args.rounds):
            hand_runs.append(run_handwritten(*common))
            exec_runs.append(run_executor(*common))
    hand = [t for run in hand_runs for t in run[args.warmup:]]
    execu = [t for run in exec_runs for t in run[args.warmup:]]
    hand_med = statistics.median(hand)
    exec_med = statistics.median(execu)
    result = {
        "benchmark": "executor_overhead",
        "command": " ".join([Path(sys.executable).name, "benchmarks/executor_overhead.py", *sys.argv[1:]]),
        "model": args.model, "pp": 2, "schedule": "1f1b", "micro_batch_size": args.micro_batch_size,
        "global_batch_size": args.global_batch_size, "steps": args.steps, "warmup_steps": args.warmup,
        "rounds": args.rounds,
        "per_round_ratio": [statistics.median(e[args.warmup:]) / statistics.median(h[args.warmup:])
                            for h, e in zip(hand_runs, exec_runs, strict=True)],
        "handwritten_median_step_s": hand_med, "executor_median_step_s": exec_med, "ratio": exec_med / hand_med,
        "target_ratio": 1.05, "within_target": exec_med / hand_med <= 1.05,
        "handwritten_step_s": hand_runs, "executor_step_s": exec_runs,
        "torch": torch.__version__, "cpus": os.cpu_count(), "omp_num_threads": env["OMP_NUM_THREADS"],
        "machine": platform.machine(), "python": platform.python_version(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"hand-written {hand_med * 1e3:.2f} ms/step, executor {exec_med * 1e3:.2f} ms/step, "
          f"ratio {exec_med / hand_med:.3f} (target <= 1.05) -> {args.out}")


if __name__ == "__main__":
    main()
