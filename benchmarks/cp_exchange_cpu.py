"""Context parallelism's two K/V exchanges, measured on this CPU and predicted by the simulator.

Three plans of one 2-layer Llama (h 128, 8 query / 4 KV heads, s 2048, fp32) on 2 gloo ranks, 4
sequences per step, FlashAttention: ``cp2`` with ``cp_comm_type=allgather`` (Llama 3's all-gather),
``cp2`` with ``p2p`` (Transformer Engine's ring) and ``dp2`` without context parallelism. Each runs
``mindpipe run --nproc 2 --steps STEPS --warmup-steps 2``; the simulator is calibrated on the dp2
and all-gather runs (``mindpipe calibrate``) and the ring run is held out. Prints and writes, per
plan, the measured and predicted (uncalibrated, calibrated) iteration time and the measured and
simulated peak memory of pipeline rank 0.

Run from the repository root (~1 min on 2 cores)::

    .venv/bin/python benchmarks/cp_exchange_cpu.py [--steps 6] [--out benchmarks/results/cp_exchange_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results" / "cp_exchange_cpu.json"
MODEL = {"kind": "llama", "num_layers": 2, "hidden_size": 128, "num_heads": 8, "num_kv_heads": 4,
         "ffn_hidden_size": 256, "vocab_size": 2048, "seq_len": 2048}
BASE = {"global_batch_size": 4, "micro_batch_size": 1, "precision": "fp32", "flash_attention": True}
PLANS = {"allgather": {**BASE, "cp": 2, "cp_comm_type": "allgather"},
         "p2p": {**BASE, "cp": 2, "cp_comm_type": "p2p"},
         "dp2": {**BASE, "dp": 2}}
FIT, HELD_OUT = ("dp2", "allgather"), ("p2p",)


def _mindpipe(*args: str, cwd: Path) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
    res = subprocess.run([sys.executable, "-m", "mindpipe.cli", *args], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=900)
    if res.returncode != 0:
        raise SystemExit(f"mindpipe {' '.join(args)} failed:\n{res.stderr[-3000:]}")
    return res.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "model.json").write_text(json.dumps(MODEL))
        for name, plan in PLANS.items():
            _mindpipe("run", "--nproc", "2", "--steps", str(args.steps), "--warmup-steps", "2", "--model", "model.json",
                      "--out", f"{name}.json", json.dumps(plan), cwd=work)
            ranks = json.loads((work / f"{name}.json").read_text())["measurement"]["ranks"]
            rank0 = next(r for r in ranks if r["rank"] == 0)
            rows[name] = {"plan": plan, "measured_peak_memory_mib": rank0["memory"]["peak_bytes"] / 2**20,
                          "memory_source": rank0["memory"]["source"]}
        cal = json.loads(_mindpipe("calibrate", *(f"{n}.json" for n in FIT), "--holdout", *(f"{n}.json" for n in HELD_OUT),
                                   "--out", "calibration.json", "--json", cwd=work))
        for part in ("fitted", "holdout"):
            for r in cal["rows"][part]:
                rows[r["name"]].update(role="fit" if part == "fitted" else "held_out", measured_s=r["measured_s"],
                                       uncalibrated_s=r["uncalibrated_s"], calibrated_s=r["calibrated_s"],
                                       calibrated_error_pct=100 * (r["calibrated_s"] / r["measured_s"] - 1))
        for name, plan in PLANS.items():
            sim = json.loads(_mindpipe("simulate", "--model", "model.json", "--cluster", "cpu:1x2", "--plan",
                                       json.dumps(plan), "--calibration", "calibration.json", "--json", cwd=work))
            rows[name]["simulated_peak_memory_mib"] = sim["memory_by_stage_gib"][0] * 1024
    result = {"what": __doc__.splitlines()[0], "model": MODEL, "steps": args.steps, "fit_on": list(FIT),
              "held_out": list(HELD_OUT), "plans": rows,
              "p2p_over_allgather_measured": rows["p2p"]["measured_s"] / rows["allgather"]["measured_s"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'plan':10s} {'role':9s} {'measured s':>10s} {'uncal. s':>9s} {'calib. s':>9s} {'err':>7s} "
          f"{'mem MiB':>8s} {'sim MiB':>8s}")
    for name, r in rows.items():
        print(f"{name:10s} {r['role']:9s} {r['measured_s']:10.3f} {r['uncalibrated_s']:9.3f} {r['calibrated_s']:9.3f} "
              f"{r['calibrated_error_pct']:+6.1f}% {r['measured_peak_memory_mib']:8.1f} "
              f"{r['simulated_peak_memory_mib']:8.1f}")
    print(f"ring / all-gather, measured: {result['p2p_over_allgather_measured']:.2f}; wrote {args.out}")


if __name__ == "__main__":
    main()
