"""Run plans with the executor from Python: ``mindpipe run`` in a subprocess, one plan at a time.

The closed loop (``make demo``, the calibration benchmark, notebook b) trains several plans and
reads their measured traces back. Each run is its own ``mindpipe run`` (on one CPU host its own rank
spawner forks the ranks), so the caller's process never imports torch or joins a process group.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mindpipe.simulator.calibrate.fidelity import plan_label
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.schema import to_dict
from mindpipe.traces.trace import Trace


class PlanRunFailed(RuntimeError):
    """``mindpipe run`` exited with an error; the message holds the tail of its stderr."""


@dataclass(frozen=True)
class RunSpec:
    """How to run a plan: steps, warm-up and the profiled step (collectives with their sizes).

    Attributes:
        steps: Training steps per run.
        warmup_steps: Leading steps left out of the aggregates (first-step costs).
        profile_last: Record the collectives of the last step (``--profile-step``); calibration
            needs them to fit the communication model, and leaves that step out of the timings.
        timeout_s: Watchdog for the whole run.
    """

    steps: int = 8
    warmup_steps: int = 2
    profile_last: bool = True
    timeout_s: float = 600.0


def run_plan(plan: Plan, model: Model | str, out: Path, spec: RunSpec | None = None,
             log: Callable[[str], None] | None = None) -> Trace:
    """Train ``plan`` on this machine's CPU (gloo), one rank per device of the plan; the measured trace.

    Raises:
        PlanRunFailed: the run did not finish (the message says why).
    """
    spec = spec or RunSpec()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model_arg = model if isinstance(model, str) else json.dumps(to_dict(model))
    cmd = [sys.executable, "-m", "mindpipe.cli", "run", json.dumps(to_dict(plan)), "--nproc", str(plan.world_size),
           "--steps", str(spec.steps), "--warmup-steps", str(spec.warmup_steps), "--model", model_arg,
           "--out", str(out), "--device", "cpu", "--run-timeout", str(spec.timeout_s)]
    if spec.profile_last:
        cmd += ["--profile-step", str(spec.steps)]
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=spec.timeout_s + 60)
    if res.returncode != 0 and _crashed(res.stderr):
        # A rank killed by a signal with no Python error: on this CPU a native crash in torch's
        # profiler/gloo teardown (pytorch/kineto#1051: aborts when profiling near the end of a run),
        # about one run in tens. Measure once more instead of losing the whole loop; say so.
        if log is not None:
            log(f"{plan_label(plan)}: {_last_line(res.stderr)}; running it again")
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=spec.timeout_s + 60)
    if res.returncode != 0:
        raise PlanRunFailed(f"mindpipe run failed (exit {res.returncode}) for plan {to_dict(plan)}:\n"
                            + res.stderr[-2000:])
    trace = Trace.load(out)
    if log is not None:
        log(f"ran {plan_label(plan)} on {plan.world_size} CPU ranks in {time.perf_counter() - start:.0f} s -> {out}")
    return trace


def _last_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _crashed(stderr: str) -> bool:
    """True when ``mindpipe run`` says a rank died of a signal without a Python error (a native crash)."""
    return any("was killed by SIG" in ln and "without a Python error" in ln for ln in stderr.splitlines())


__all__ = ["PlanRunFailed", "RunSpec", "run_plan"]
