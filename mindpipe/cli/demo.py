"""``mindpipe demo``: the closed loop on this CPU (:mod:`mindpipe.loop`): profile, tune, run, calibrate, report."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mindpipe.traces.errors import ContractError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``demo`` subcommand to ``sub`` and return its parser."""
    p = sub.add_parser("demo", help="the closed loop on this CPU: profile, tune, run, calibrate, report")
    p.add_argument("--out", default="results", metavar="DIR", help="output directory (default results)")
    p.add_argument("--model", default="gpt-tiny-32k", help="built-in model or model file (default gpt-tiny-32k)")
    p.add_argument("--ranks", type=int, default=2, help="CPU ranks, one per core is best (default 2)")
    p.add_argument("--global-batch", type=int, default=8, help="samples per iteration (default 8)")
    p.add_argument("--steps", type=int, default=5, help="training steps per run (default 5)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every measured plan (default 3)")
    p.set_defaults(func=cmd_demo)
    return p


def cmd_demo(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the loop and print the measured speedup, the held-out fidelity and where the report is."""
    from mindpipe.loop import LoopConfig, closed_loop  # the loop imports torch once it profiles
    from mindpipe.loop_report import verdict
    from mindpipe.runs import RunSpec

    if args.steps < 2:
        raise ContractError("--steps", None, f"--steps {args.steps}: a run needs at least 2 steps (one warm-up)")
    cfg = LoopConfig(model=args.model, ranks=args.ranks, global_batch=args.global_batch, rounds=args.rounds,
                     run=RunSpec(steps=args.steps, warmup_steps=min(2, max(1, args.steps - 4))), out=Path(args.out))
    res = closed_loop(cfg)
    overlap = "overlap" if res.ranges_overlap else "do not overlap"
    print(f"tuned plan {res.speedup:.2f}x {verdict(res.speedup)} the default plan (measured {res.tuned_s:.3f} s vs "
          f"{res.default_s:.3f} s per iteration; their rounds {overlap}); tuner regret {100 * res.regret:.1f}%")
    s = res.holdout
    if s.get("n"):
        print(f"held-out fidelity over {s['n']} plans: MAPE {s['mape_uncalibrated_pct']:.1f}% uncalibrated, "
              f"{s['mape_calibrated_pct']:.1f}% calibrated")
    print(f"report: {res.report}")
    return 0


__all__ = ["add_parser", "cmd_demo"]
