"""Time and memory of the largest inputs the stated limits allow (README "Limits").

Run: ``.venv/bin/python benchmarks/input_limits.py [--only NAME ...]``. Each case is one
``mindpipe`` command at (or next to) a limit, run in a child process; the wall time and the
child's peak resident memory (``wait4``'s ``ru_maxrss``) are printed and written to
``benchmarks/results/input_limits.json`` with the load average before and after (the machine
may be shared). The target: every case well under 60 s and 2 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mindpipe.traces.limits import limit

OUT = Path(__file__).resolve().parent / "results" / "input_limits.json"
MINDPIPE = [sys.executable, "-m", "mindpipe.cli"]


def _model(**kw: int) -> str:
    spec = {"kind": "gpt", "num_layers": 96, "hidden_size": 12288, "num_heads": 96, "seq_len": 2048,
            "vocab_size": 51200}
    return json.dumps({**spec, **kw})


def cases(tmp: Path) -> dict[str, list[str]]:
    """Name → arguments of ``mindpipe``: each at a limit (the README's table)."""
    m, stages = int(limit("micro_batches")), int(limit("microbatch_stages"))
    big = _model(num_layers=int(limit("num_layers")), hidden_size=4096, num_heads=32)
    widest = _model(num_layers=128, hidden_size=int(limit("hidden_size")), num_heads=1024,
                    seq_len=int(limit("seq_len")), vocab_size=int(limit("vocab_size")),
                    ffn_hidden_size=int(limit("ffn_hidden_size")))
    pp_max = int(limit("pipeline_stages"))
    sim = ["simulate", "--json"]
    return {
        "m at its limit (16,384), pp 8, 1f1b": [*sim, "--model", _model(), "--cluster", "a100-sxm4-80gb:1x8",
                                                 "--plan", json.dumps({"pp": 8, "global_batch_size": m})],
        "pp at its limit (4,096), 16,384 layers, gpipe m 32": [
            *sim, "--model", big, "--cluster", "a100-sxm4-80gb:512x8",
            "--plan", json.dumps({"pp": pp_max, "global_batch_size": stages // pp_max, "schedule": "gpipe"})],
        "interleaved pp 64 × v 2, m 1,024": [
            *sim, "--model", _model(num_layers=128), "--cluster", "a100-sxm4-80gb:8x8",
            "--plan", json.dumps({"pp": 64, "virtual_stages": 2, "schedule": "interleaved_1f1b",
                                  "global_batch_size": stages // 128})],
        "zbv pp 256 × v 2, m 256": [
            *sim, "--model", _model(num_layers=512), "--cluster", "a100-sxm4-80gb:32x8",
            "--plan", json.dumps({"pp": 256, "virtual_stages": 2, "schedule": "zbv", "global_batch_size": 256})],
        "devices at the limit (131,072): dp": [
            *sim, "--model", _model(), "--cluster", "a100-sxm4-80gb:16384x8",
            "--plan", json.dumps({"dp": int(limit("devices")), "global_batch_size": int(limit("devices")),
                                  "zero_stage": 1})],
        "every model size at its limit, tp 1,024 × pp 128, m 1,024": [
            *sim, "--model", widest, "--cluster", "a100-sxm4-80gb:128x1024",
            "--plan", json.dumps({"tp": 1024, "pp": 128, "global_batch_size": 1024, "sequence_parallel": True,
                                  "recompute": "full"})],
        "m at its limit with --timeline and --gantt": [
            "simulate", "--model", _model(), "--cluster", "a100-sxm4-80gb:1x8",
            "--plan", json.dumps({"pp": 8, "global_batch_size": m}),
            "--timeline", str(tmp / "timeline.json"), "--gantt", str(tmp / "gantt.png")],
        "tune --global-batch over the widest range": [
            "tune", "--model", "gpt-13b", "--cluster", "a100-sxm4-80gb:8x8", "--out", str(tmp / "tune"), "--budget",
            "20", "--global-batch", f"1:{int(limit('global_batch_size'))}", "--quiet", "--no-plots", "--json"],
    }


def run(argv: list[str]) -> dict[str, float | int]:
    """Run one command; wall seconds, peak RSS (MiB) and exit code."""
    t = time.perf_counter()
    proc = subprocess.Popen([*MINDPIPE, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    err = proc.stderr.read() if proc.stderr else ""
    return {"wall_s": round(wall, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "exit": os.waitstatus_to_exitcode(status), "stderr_tail": err.strip().splitlines()[-1:] if err else []}


def main() -> None:
    """Run every case (or the ``--only`` ones) and write the results."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="substrings of case names to run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        chosen = {k: v for k, v in cases(Path(d)).items() if not args.only or any(o in k for o in args.only)}
        load_before = os.getloadavg()
        results = {}
        for name, argv in chosen.items():
            results[name] = run(argv)
            r = results[name]
            print(f"{name:60s} {r['wall_s']:7.2f} s {r['peak_rss_mib']:8.1f} MiB exit {r['exit']}", flush=True)
    doc = {"cases": results, "load_before": load_before, "load_after": os.getloadavg(), "cpus": os.cpu_count(),
           "target": "each case under 60 s and 2 GiB"}
    if not args.only:
        OUT.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
