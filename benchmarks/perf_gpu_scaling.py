"""H100 and H200 vs A100: do predicted times scale with the FLOP/s and bandwidth ratios?

H100/H200 have no fitted constants of their own; they reuse the A100 curves with their own peak
FLOP/s, HBM bandwidth, NVLink bandwidth and SM count (:mod:`mindpipe.simulator.perf`). For the same
configurations (vTrain-like small and large GPT blocks, LM head, optimizer step, TP all-reduce)
this prints the A100/H100 and A100/H200 time ratios next to the hardware ratios they should
follow, and checks the documented expectation:

* GEMM-bound work speeds up by the dense-FLOP/s ratio (3.17×), within what wave quantisation on
  132 vs 108 SMs changes (±10% here), less where the memory floor bites — never below the HBM ratio;
* memory-bound work (element-wise ops, the optimizer step) by the HBM bandwidth ratio (1.64× H100,
  2.35× H200) — minus fixed per-kernel overheads;
* a whole block lands between the two; H200 vs H100 differs only through memory-bound work
  (speed-up between 1 and their HBM ratio 1.43×);
* NVLink collectives by the NVLink ratio (1.5×) for large messages, less for latency-bound ones.

Writes ``benchmarks/results/perf_gpu_scaling.json``.

    .venv/bin/python benchmarks/perf_gpu_scaling.py
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mindpipe.simulator.ops import block_ops, lm_head_ops
from mindpipe.simulator.perf import GpuComputeModel, NcclCommModel, collective_time_s
from mindpipe.traces.catalog import DeviceSpec, get_device
from mindpipe.traces.config import Model, Plan

# Wave quantisation on 132 SMs (H100/H200) vs 108 (A100) can favour either GPU for a given shape;
# for these shapes by up to ~5%, so ratios are checked against the FLOP/s ratio within 10%.
QUANT_TOL = 1.10
DEVICES = ("a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb")
CONFIGS = [
    # (label, model, micro-batch, tp)
    ("vtrain-single h1024 b1 tp1", Model(kind="gpt", num_layers=1, hidden_size=1024, num_heads=16, seq_len=1024, vocab_size=50304), 1, 1),
    ("vtrain-single h2048 b8 tp2", Model(kind="gpt", num_layers=1, hidden_size=2048, num_heads=16, seq_len=1024, vocab_size=50432), 8, 2),
    ("gpt-13b b1 tp8", Model(kind="gpt", num_layers=1, hidden_size=5120, num_heads=40, seq_len=2048, vocab_size=51200), 1, 8),
    ("gpt3-175b b2 tp8", Model(kind="gpt", num_layers=1, hidden_size=12288, num_heads=96, seq_len=2048, vocab_size=51200), 2, 8),
    ("gpt3-175b b1 tp4", Model(kind="gpt", num_layers=1, hidden_size=12288, num_heads=96, seq_len=2048, vocab_size=50688), 1, 4),
]


def parts(dev: DeviceSpec, model: Model, b: int, tp: int) -> dict[str, float]:
    """GPU seconds (no host bound) of one block's GEMMs, memory ops and total, and the LM head."""
    m = GpuComputeModel(dev, host_bound=False)
    ops = block_ops(model, b, model.seq_len, tp, False, 2)
    gemm = sum(m.op_s(o, "fp16") for o in ops if o.kind in ("gemm", "bmm"))
    mem = sum(m.op_s(o, "fp16") for o in ops if o.kind == "memory")
    head = sum(m.op_s(o, "fp16") for o in lm_head_ops(model, b, model.seq_len, tp, 2))
    return {"block_gemm_s": gemm, "block_memory_s": mem, "block_s": gemm + mem, "lm_head_s": head}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "perf_gpu_scaling.json"))
    args = ap.parse_args()
    devs = {n: get_device(n) for n in DEVICES}
    a100 = devs["a100-sxm4-80gb"]
    hw = {n: {"flops": d.peak_flops("fp16") / a100.peak_flops("fp16"),
              "hbm": d.memory_bandwidth_GBps / a100.memory_bandwidth_GBps,
              "nvlink": d.nvlink_bandwidth_unidirectional_GBps / a100.nvlink_bandwidth_unidirectional_GBps}
          for n, d in devs.items()}
    rows, failures = [], []
    print(f"{'configuration':28s} {'device':16s} {'block':>7s} {'GEMMs':>7s} {'memory':>7s} {'LM head':>8s}   (speed-up vs A100)")
    for label, model, b, tp in CONFIGS:
        base = parts(a100, model, b, tp)
        for name in DEVICES[1:]:
            got = parts(devs[name], model, b, tp)
            ratio = {k: base[k] / got[k] for k in base}
            r = hw[name]
            checks = {
                "gemm_between_hbm_and_flops": r["hbm"] <= ratio["block_gemm_s"] <= r["flops"] * QUANT_TOL,
                "memory_at_most_hbm_ratio": ratio["block_memory_s"] <= r["hbm"] * 1.0001,
                "block_between_hbm_and_flops": r["hbm"] <= ratio["block_s"] <= r["flops"] * QUANT_TOL,
            }
            if label.startswith("gpt3-175b"):  # GEMM-bound: the FLOP/s ratio itself, up to quantisation
                checks["large_gemms_near_flops_ratio"] = abs(ratio["block_gemm_s"] / r["flops"] - 1) < QUANT_TOL - 1
            failures += [f"{label} {name} {k}" for k, ok in checks.items() if not ok]
            rows.append({"config": label, "device": name, "ratios": ratio, "hardware_ratios": r, "checks": checks,
                         "a100_s": base, "device_s": got})
            print(f"{label:28s} {name:16s} {ratio['block_s']:6.2f}x {ratio['block_gemm_s']:6.2f}x "
                  f"{ratio['block_memory_s']:6.2f}x {ratio['lm_head_s']:7.2f}x")
    for label, model, b, tp in CONFIGS:
        h100, h200 = parts(devs[DEVICES[1]], model, b, tp), parts(devs[DEVICES[2]], model, b, tp)
        if not 1.0 <= h100["block_s"] / h200["block_s"] <= hw[DEVICES[2]]["hbm"] / hw[DEVICES[1]]["hbm"]:
            failures.append(f"{label} h200 vs h100 outside [1, HBM ratio]")
    opt = {n: GpuComputeModel(d).optimizer_step_s(10**9, Plan(precision="fp16")) for n, d in devs.items()}
    comm = NcclCommModel()
    ar = {n: {size: collective_time_s("allreduce", size, 8, "nvlink", d.nvlink_bandwidth_unidirectional_GBps * 1e9, comm)
              for size in (2**20, 2**26, 2**30)} for n, d in devs.items()}
    print("\nhardware ratios vs A100: " + "; ".join(f"{n}: FLOP/s {r['flops']:.2f}x, HBM {r['hbm']:.2f}x, NVLink "
                                                   f"{r['nvlink']:.2f}x" for n, r in hw.items() if n != a100.name))
    print("optimizer step (1e9 params): " + ", ".join(f"{n} {t * 1e3:.1f} ms ({opt[a100.name] / t:.2f}x)" for n, t in opt.items()))
    for size in (2**20, 2**26, 2**30):
        print(f"8-GPU NVLink all-reduce {size // 2**20:5d} MiB: " + ", ".join(
            f"{n} {ar[n][size] * 1e6:.0f} us ({ar[a100.name][size] / ar[n][size]:.2f}x)" for n in DEVICES))
    print("\nchecks: " + ("all consistent with the FLOP/s and bandwidth ratios" if not failures else f"FAILED {failures}"))
    result = {"hardware_ratios": hw, "rows": rows, "optimizer_step_s": opt,
              "allreduce_8gpu_s": {n: {str(k): v for k, v in d.items()} for n, d in ar.items()}, "failures": failures}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    if failures:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
