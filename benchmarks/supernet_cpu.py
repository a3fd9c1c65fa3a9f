"""Supernet training speed on this CPU: CSP vs sequential on pp=2 (issue 17 acceptance: CSP ≥ 1.4×).

Trains the same subnets with ``mindpipe run`` on two CPU/gloo ranks (one thread each), with
``subnet_schedule`` ``csp`` and ``sequential``, at a micro-batch large enough that compute dominates
the activation transfers and the per-subnet update (default 32 sequences of 32 tokens). The
default space, ``k24``, is ``supernet-mini``'s shape (8 choice layers, width 64) with 24 candidates
per layer (attention 2-16 heads, FFN 64-320 wide, separable and lightweight convolutions): with 4
layers per stage two subnets share an operator on a stage with probability 1 − (23/24)^4 ≈ 16 %,
against 52 % for ``supernet-mini``'s 6 candidates (``--space mini``), where conflicts stall CSP. The runs alternate for ``--rounds`` rounds (sequential, csp, sequential, csp …) so
drift in the machine's speed falls on both alike; each run's figure is its measured
``subnets_per_hour`` (subnets over the slowest rank's wall time, first subnet to last update). The
ratio reported is the geometric mean of the per-round ratios, with the medians of each schedule.
Both runs' losses are also compared bit for bit (CSP is bit-identical to sequential training).
Writes ``benchmarks/results/supernet_cpu.json`` with the load average before and after.

    .venv/bin/python benchmarks/supernet_cpu.py [--rounds 3] [--subnets 200] [--micro-batch-size 32] [--space k24|mini]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mindpipe.traces.trace import Trace

HERE = Path(__file__).resolve().parent
TARGET = 1.4


def k24_space() -> dict[str, Any]:
    """The benchmark's default supernet: supernet-mini's shape with 24 candidates per layer."""
    c: list[dict[str, Any]] = [{"name": f"attn{a}", "op": "attention", "num_heads": a} for a in (2, 4, 8, 16)]
    c += [{"name": f"ffn{f}", "op": "ffn", "ffn_hidden_size": f} for f in (64, 96, 128, 160, 192, 224, 256, 320)]
    c += [{"name": f"sepconv{k}", "op": "conv", "kernel_size": k} for k in (3, 5, 7, 9, 11, 13)]
    c += [{"name": f"lwconv{k}r{r}", "op": "conv", "kernel_size": k, "conv_type": "lightweight", "conv_heads": r}
          for k in (3, 5, 7) for r in (1, 4)]
    return {"kind": "supernet", "name": "supernet-mini-k24", "num_layers": 8, "hidden_size": 64, "seq_len": 32,
            "vocab_size": 512, "candidates": c}


def run(schedule: str, subnets: int, mbs: int, model: str, tmp: Path,
        env: dict[str, str]) -> tuple[float, list[bytes], dict[str, Any]]:
    """One ``mindpipe run``: (subnets/hour, float32 bits of every loss, per-stage compute/stall seconds)."""
    plan = json.dumps({"pp": 2, "micro_batch_size": mbs, "global_batch_size": mbs, "subnet_schedule": schedule})
    out = tmp / f"{schedule}.json"
    cmd = [sys.executable, "-m", "mindpipe.cli", "run", plan, "--nproc", "2", "--steps", str(subnets),
           "--model", model, "--device", "cpu", "--out", str(out)]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    m = Trace.load(out).measurement
    if m is None or m.subnets is None or m.subnets_per_hour is None or m.subnet_stages is None:
        raise RuntimeError("the run wrote no subnet measurement")
    stages = {f"stage{r.stage}": {"compute_s": round(r.compute_s, 4), "stall_s": round(r.stall_s, 4),
                                  "update_s": round(r.update_s, 4)} for r in m.subnet_stages}
    return m.subnets_per_hour, [struct.pack("<f", s.loss) for s in m.subnets], stages


def main() -> int:
    """Run the rounds, print the figures, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--subnets", type=int, default=200)
    p.add_argument("--micro-batch-size", type=int, default=32)
    p.add_argument("--space", choices=("k24", "mini"), default="k24")
    p.add_argument("--out", default=str(HERE / "results" / "supernet_cpu.json"))
    args = p.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    model = json.dumps(k24_space()) if args.space == "k24" else "supernet-mini"
    load_before = os.getloadavg()
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for i in range(args.rounds):
            load = os.getloadavg()[0]  # other processes on the cores slow csp (both ranks busy) more than sequential
            seq, seq_bits, seq_stages = run("sequential", args.subnets, args.micro_batch_size, model, tmp, env)
            csp, csp_bits, csp_stages = run("csp", args.subnets, args.micro_batch_size, model, tmp, env)
            rounds.append({"load_1min_at_start": load, "sequential_subnets_per_hour": seq, "csp_subnets_per_hour": csp, "ratio": csp / seq,
                           "bit_identical": seq_bits == csp_bits, "sequential_stages": seq_stages,
                           "csp_stages": csp_stages})
            print(f"round {i + 1}: sequential {seq:,.0f} subnets/h, csp {csp:,.0f} subnets/h, ratio {csp / seq:.3f}, "
                  f"bit-identical {seq_bits == csp_bits} (load {load:.1f})", flush=True)
    ratio = math.exp(statistics.fmean(math.log(r["ratio"]) for r in rounds))
    result = {
        "model": "supernet-mini-k24" if args.space == "k24" else "supernet-mini", "plan": {"pp": 2, "micro_batch_size": args.micro_batch_size},
        "subnets": args.subnets, "rounds": rounds,
        "sequential_subnets_per_hour_median": statistics.median(r["sequential_subnets_per_hour"] for r in rounds),
        "csp_subnets_per_hour_median": statistics.median(r["csp_subnets_per_hour"] for r in rounds),
        "ratio_geomean": ratio, "target": TARGET, "meets_target": ratio >= TARGET,
        "all_bit_identical": all(r["bit_identical"] for r in rounds),
        "cpu_count": os.cpu_count(), "load_average_before": load_before, "load_average_after": os.getloadavg(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"csp / sequential = {ratio:.3f} (target >= {TARGET}); wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
