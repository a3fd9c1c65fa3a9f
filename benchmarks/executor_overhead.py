"""Executor overhead: ``mindpipe run`` vs a minimal hand-written pipelining script (issue 5).

Trains ``gpt-mini`` with pp=2 and the 1F1B schedule twice on this machine — once with the
executor (``mindpipe run``, torch's ``Schedule1F1B``, all measurement hooks on) and once with
``benchmarks/executor_handwritten_pp.py`` (the same model, batch, schedule and optimizer, nothing
else) — and compares the median step time after warm-up (per step, the slowest rank's wall time).
The acceptance target is a ratio within 1.05. Writes ``benchmarks/results/executor_overhead.json``.

    .venv/bin/python benchmarks/executor_overhead.py [--steps 30] [--warmup 5] [--micro-batch-size 2] [--global-batch-size 16]
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

from executor.launch import free_port
from traces.trace import Trace

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
        hand = run_handwritten(*common)
        execu = run_executor(*common)
    hand_med = statistics.median(hand[args.warmup:])
    exec_med = statistics.median(execu[args.warmup:])
    result = {
        "benchmark": "executor_overhead",
        "command": " ".join([Path(sys.executable).name, "benchmarks/executor_overhead.py", *sys.argv[1:]]),
        "model": args.model, "pp": 2, "schedule": "1f1b", "micro_batch_size": args.micro_batch_size,
        "global_batch_size": args.global_batch_size, "steps": args.steps, "warmup_steps": args.warmup,
        "handwritten_median_step_s": hand_med, "executor_median_step_s": exec_med, "ratio": exec_med / hand_med,
        "target_ratio": 1.05, "within_target": exec_med / hand_med <= 1.05,
        "handwritten_step_s": hand, "executor_step_s": execu,
        "torch": torch.__version__, "cpus": os.cpu_count(), "omp_num_threads": env["OMP_NUM_THREADS"],
        "machine": platform.machine(), "python": platform.python_version(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"hand-written {hand_med * 1e3:.2f} ms/step, executor {exec_med * 1e3:.2f} ms/step, "
          f"ratio {exec_med / hand_med:.3f} (target <= 1.05) -> {args.out}")


if __name__ == "__main__":
    main()
