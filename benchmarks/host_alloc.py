"""What the CPU ranks' allocator settings change: a split backward's actions, with glibc's defaults and with the executor's.

``mindpipe run`` starts its CPU ranks with glibc's mmap threshold pinned at 32 MiB and the heap
never trimmed (:mod:`mindpipe.traces.host_alloc`). This runs ``gpt-tiny-8k`` on 2 CPU ranks as
pp2 at micro-batch 2 with ``1f1b`` (fused backward B) and ``zb_h1`` (split backward I + W), each
with glibc's defaults (opted out through a no-op ``GLIBC_TUNABLES=glibc.malloc.perturb=0``) and
with the executor's settings, in ``--rounds`` interleaved rounds, and prints per action the median
over rounds of each run's median duration, and the last stage's I + W over its fused B.

Usage (from the repository root, nothing else running)::

    .venv/bin/python benchmarks/host_alloc.py [--rounds 3] [--out benchmarks/results/host_alloc.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from mindpipe.simulator.calibrate.runs import load_run

from mindpipe.loop import demo_plan
from mindpipe.runs import RunSpec, run_plan

PLANS = {"1f1b": demo_plan(pp=2, micro_batch_size=2, global_batch_size=16, schedule="1f1b"),
         "zb_h1": demo_plan(pp=2, micro_batch_size=2, global_batch_size=16, schedule="zb_h1")}
SETTINGS = {"glibc defaults": {"GLIBC_TUNABLES": "glibc.malloc.perturb=0"}, "executor": {}}


def _action_medians(path: Path) -> dict[str, float]:
    """Per ``stage+kind`` (e.g. ``1I``), the median duration in ms over the run's clean steps."""
    run = load_run(path)
    times: dict[str, list[float]] = defaultdict(list)
    for a in run.measurement.actions:
        if a.step in run.clean_steps:
            times[f"{a.stage}{a.kind}"].append(a.duration_s * 1e3)
    return {k: statistics.median(v) for k, v in sorted(times.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/host_alloc.json"))
    args = ap.parse_args()
    runs: dict[str, dict[str, list[dict[str, float]]]] = {s: {p: [] for p in PLANS} for s in SETTINGS}
    saved = os.environ.get("GLIBC_TUNABLES")
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for setting, env in SETTINGS.items():
                for name, plan in PLANS.items():
                    os.environ.update(env)
                    try:
                        path = Path(tmp) / f"{name}-{setting.replace(' ', '_')}-{r}.json"
                        run_plan(plan, "gpt-tiny-8k", path, RunSpec(steps=6, warmup_steps=2, profile_last=False))
                    finally:  # run_plan's launcher reads os.environ: put back what the caller had
                        os.environ.pop("GLIBC_TUNABLES", None)
                        if saved is not None:
                            os.environ["GLIBC_TUNABLES"] = saved
                    runs[setting][name].append(_action_medians(path))
                    print(f"round {r + 1}/{args.rounds} {setting:>14} {name:>5}: "
                          + " ".join(f"{k} {v:.1f}" for k, v in runs[setting][name][-1].items()), flush=True)
    out: dict[str, Any] = {"model": "gpt-tiny-8k", "plans": "pp2 mb2, global batch 16, 2 CPU ranks",
                           "rounds": args.rounds, "unit": "ms per action, median over rounds of each run's median",
                           "settings": {}}
    for setting in SETTINGS:
        per_plan = {name: {k: round(statistics.median(r[k] for r in rounds), 2) for k in rounds[0]}
                    for name, rounds in runs[setting].items()}
        zb, fused = per_plan["zb_h1"], per_plan["1f1b"]
        ratio = (zb["1I"] + zb["1W"]) / fused["1B"]
        out["settings"][setting] = {"actions": per_plan, "last_stage_split_over_fused": round(ratio, 3)}
        print(f"{setting:>14}: last stage I {zb['1I']:.1f} + W {zb['1W']:.1f} ms over fused B {fused['1B']:.1f} ms = {ratio:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
