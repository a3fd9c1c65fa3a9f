"""``mindpipe demo``: the closed loop on this CPU (:mod:`mindpipe.loop`): profile, tune, run, calibrate, report."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mindpipe.cli import loaders
from mindpipe.cli.args import count
from mindpipe.cli.output import check_outputs, stderr
from mindpipe.cli.profile import check_memory
from mindpipe.traces.units import plural

# The demo trains every plan on this machine's CPU: bounds that keep it a demo.
MAX_RANKS = 64
MAX_GLOBAL_BATCH = 4096
MAX_STEPS = 1000
MAX_ROUNDS = 20


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``demo`` subcommand to ``sub`` and return its parser."""
    p = sub.add_parser("demo", help="the closed loop on this CPU: profile, tune, run, calibrate, report")
    p.add_argument("--out", default="results", metavar="DIR", help="output directory (default results)")
    p.add_argument("--model", default="gpt-tiny-8k", help="built-in model or model file (default gpt-tiny-8k)")
    p.add_argument("--ranks", type=count(1, MAX_RANKS), default=2,
                   help=f"CPU ranks, 1 to {MAX_RANKS}; one per core is best (default 2)")
    p.add_argument("--global-batch", type=count(1, MAX_GLOBAL_BATCH), default=16,
                   help=f"samples per iteration, a multiple of 16 (the calibration probes' dp 2 × micro-batch 8) up to "
                        f"{MAX_GLOBAL_BATCH} (default 16)")
    p.add_argument("--steps", type=count(3, MAX_STEPS), default=8,
                   help=f"training steps per run, 3 (a warm-up, a timed and the profiled last step) to {MAX_STEPS} "
                        "(default 8)")
    p.add_argument("--rounds", type=count(1, MAX_ROUNDS), default=3,
                   help=f"interleaved rounds of every measured plan, 1 to {MAX_ROUNDS} (default 3)")
    p.set_defaults(func=cmd_demo)
    return p


def cmd_demo(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the loop and print the measured speedup, the held-out fidelity and where the report is."""
    from mindpipe.loop import LoopConfig, closed_loop  # the loop imports torch once it profiles
    from mindpipe.loop_report import verdict
    from mindpipe.runs import PlanRunFailed, RunSpec

    cfg = LoopConfig(model=args.model, ranks=args.ranks, global_batch=args.global_batch, rounds=args.rounds,
                     run=RunSpec(steps=args.steps, warmup_steps=min(2, max(1, args.steps - 4))), out=Path(args.out))
    # Refused before the loop starts: an --out that cannot be a directory, a model that cannot be read
    # or profiled in this machine's memory (the loop's first step profiles it at its micro-batch).
    check_outputs(dirs=[args.out])
    check_memory(loaders.model(args.model), args.model, cfg.profile_micro_batch)
    try:
        res = closed_loop(cfg)
    except PlanRunFailed as e:
        # One line: the run's own last error line; exit 2 when the run refused its input, else 1.
        lines = [line for line in str(e).splitlines() if line.strip()]
        last = lines[-1].removeprefix("mindpipe: error: ") if lines else "no output"
        stderr(f"mindpipe: error: demo: a training run failed: {last}")
        return 2 if "(exit 2)" in (lines[0] if lines else "") else 1
    overlap = "overlap" if res.ranges_overlap else "do not overlap"
    print(f"tuned plan {res.speedup:.2f}x {verdict(res.speedup)} the default plan (measured {res.tuned_s:.3f} s vs "
          f"{res.default_s:.3f} s per iteration; their rounds {overlap}); tuner regret {100 * res.regret:.1f}%")
    s = res.holdout
    if s.n and s.mape_calibrated_pct is not None:
        print(f"held-out fidelity over {plural(s.n, 'plan')}: MAPE {s.mape_uncalibrated_pct:.1f}% uncalibrated, "
              f"{s.mape_calibrated_pct:.1f}% calibrated")
    print(f"report: {res.report}")
    return 0


__all__ = ["add_parser", "cmd_demo"]
