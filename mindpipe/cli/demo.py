"""``mindpipe demo``: the closed loop on this CPU (:mod:`mindpipe.loop`): profile, tune, run, calibrate, report."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``demo`` subcommand to ``sub`` and return its parser."""
    p = sub.add_parser("demo", help="the closed loop on this CPU: profile, tune, run, calibrate, report")
    p.add_argument("--out", default="results", metavar="DIR", help="output directory (default results)")
    p.add_argument("--model", default="gpt-mini", help="built-in model or model file (default gpt-mini)")
    p.add_argument("--ranks", type=int, default=4, help="CPU ranks (default 4)")
    p.add_argument("--global-batch", type=int, default=32, help="samples per iteration (default 32)")
    p.add_argument("--steps", type=int, default=8, help="training steps per run (default 8)")
    p.set_defaults(func=cmd_demo)
    return p


def cmd_demo(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the loop and print the measured speedup, the held-out fidelity and where the report is."""
    from mindpipe.loop import LoopConfig, _verdict, closed_loop  # the loop imports torch once it profiles
    from mindpipe.runs import RunSpec

    cfg = LoopConfig(model=args.model, ranks=args.ranks, global_batch=args.global_batch,
                     run=RunSpec(steps=args.steps, warmup_steps=min(2, max(0, args.steps - 3))), out=Path(args.out))
    res = closed_loop(cfg)
    print(f"tuned plan {res.speedup:.2f}x {_verdict(res.speedup)} the default plan (measured {res.tuned_s:.3f} s vs "
          f"{res.default_s:.3f} s per iteration)")
    s = res.holdout
    if s.get("n"):
        print(f"held-out fidelity over {s['n']} plans: MAPE {s['mape_uncalibrated_pct']:.1f}% uncalibrated, "
              f"{s['mape_calibrated_pct']:.1f}% calibrated")
    print(f"report: {res.report}")
    return 0


__all__ = ["add_parser", "cmd_demo"]
