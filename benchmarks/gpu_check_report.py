"""Figures from a GPU check's results (``benchmarks/gpu_check.sh``), on any machine.

1. Memory on CUDA: for each single-GPU run, the simulator's peak (``Simulator.memory`` with, of the
   framework reserve, only the cuBLAS workspaces the allocator holds), the executor's live-tensor
   accounting (the tensor terms, counted as the tensors live) and the caching allocator's peak
   (``torch.cuda.max_memory_allocated``): error = (simulated − allocator) / allocator.
2. Compute on the GPU: each profiled layer's measured forward / input-gradient / weight-gradient
   times against the simulator's analytic GPU model (``GpuComputeModel``, no trace) for the same
   shapes: ratio = predicted / measured (below 1: the simulator is optimistic).

    .venv/bin/python benchmarks/gpu_check_report.py [DIR] [--out DIR/report.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mindpipe.simulator.calibrate.memory_fidelity import memory_rows
from mindpipe.simulator.memory import allocator_overhead_bytes
from mindpipe.simulator.perf.gpu import GpuComputeModel
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Plan
from mindpipe.traces.trace import Trace

HERE = Path(__file__).resolve().parent
MIB = 2**20


def run_files(d: Path, pattern: str = "run_*.json") -> list[Path]:
    """The measured traces in ``d`` (``mindpipe run --out``), not the timelines written beside them."""
    return [f for f in sorted(d.glob(pattern)) if not f.name.endswith(".timeline.json")]


def memory_table(d: Path) -> list[dict[str, Any]]:
    rows = []
    for f in run_files(d):
        t = Trace.load(f)
        m = t.measurement
        if m is None or t.model is None:
            continue
        for r in memory_rows(m, t.model):
            mem = next(x.memory for x in m.ranks if x.rank == r.rank)
            assert mem is not None
            rows.append({"run": f.stem[4:], "device": m.device_name, "torch": m.torch_version,
                         "simulated_mib": r.predicted_bytes / MIB, "accounted_mib": mem.accounted_peak_bytes / MIB,
                         "allocator_mib": r.measured_bytes / MIB, "host_pool_mib": mem.host_pool_peak_bytes / MIB,
                         "error_vs_allocator": r.rel_error,
                         # the tensor terms alone against the live-tensor accounting (which sees no workspace)
                         "error_vs_accounting": (r.predicted_bytes - allocator_overhead_bytes(get_device(m.device_name)))
                         / mem.accounted_peak_bytes - 1,
                         "iteration_s": m.plan.global_batch_size * t.seq_len / m.tokens_per_s if m.tokens_per_s else None,
                         "energy_source": m.energy_source})
    return rows


def compute_table(d: Path) -> list[dict[str, Any]]:
    rows = []
    for f in sorted(d.glob("profile_*.json")):
        t = Trace.load(f)
        if t.model is None or t.granularity != "layer":
            continue
        plan = Plan(micro_batch_size=t.micro_batch_size, global_batch_size=t.micro_batch_size, precision=t.dtype,
                    flash_attention=t.flash_attention)
        costs = GpuComputeModel(get_device(t.device)).layer_costs(t.model, plan)
        for layer, c in zip(t.layers, costs, strict=True):
            meas = (layer.forward_s, layer.backward_input_s, layer.backward_weight_s)
            pred = (c.forward_s, c.backward_input_s, c.backward_weight_s)
            rows.append({"profile": f.stem[8:], "device": t.device, "layer": layer.name,
                         "measured_ms": [round(x * 1e3, 3) for x in meas], "predicted_ms": [round(x * 1e3, 3) for x in pred],
                         "predicted_over_measured": sum(pred) / sum(meas),
                         "measured_tflops": (layer.forward_flops + (layer.backward_flops or 0)) / sum(meas) / 1e12
                         if layer.forward_flops else None})
    return rows


def op_table(d: Path) -> list[dict[str, Any]]:
    """Operator-granularity profiles: each operator's measured forward / B / W milliseconds."""
    rows = []
    for f in sorted(d.glob("profile_*.json")):
        t = Trace.load(f)
        if t.granularity != "op":
            continue
        rows += [{"profile": f.stem[8:], "op": r.name, "kind": r.kind,
                  "measured_ms": [round(x * 1e3, 3) for x in (r.forward_s, r.backward_input_s, r.backward_weight_s)]}
                 for r in t.layers]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="?", default=str(HERE / "results" / "gpu"))
    ap.add_argument("--out")
    args = ap.parse_args()
    d = Path(args.dir)
    mem, comp = memory_table(d), compute_table(d)
    print("memory on CUDA (one GPU): simulated vs the executor's accounting vs the allocator's peak")
    for r in mem:
        print(f"  {r['run']:<20} simulated {r['simulated_mib']:8.1f} MiB  accounted {r['accounted_mib']:8.1f}  "
              f"allocator {r['allocator_mib']:8.1f}  error {100 * float(r['error_vs_allocator']):+5.1f} % "
              f"(vs accounting {100 * float(r['error_vs_accounting']):+5.2f} %)  host pool {r['host_pool_mib']:.0f} MiB")
    print("compute: profiled layer times vs the analytic GPU model (predicted / measured)")
    for r in comp:
        tf = f"{r['measured_tflops']:.0f} TFLOP/s" if r["measured_tflops"] else ""
        print(f"  {r['profile']:<16} {r['layer']:<11} measured F/B/W {r['measured_ms']} ms  predicted {r['predicted_ms']} ms  "
              f"ratio {float(r['predicted_over_measured']):.3f}  {tf}")
    ops = op_table(d)
    if ops:
        print("operator-granularity profiles (measured F/B/W ms)")
        for r in ops:
            print(f"  {r['profile']:<16} {r['op']:<28} {r['kind']:<14} {r['measured_ms']}")
    worst = max((abs(float(r["error_vs_allocator"])) for r in mem), default=None)
    out = Path(args.out) if args.out else d / "report.json"
    out.write_text(json.dumps({"memory": mem, "compute": comp, "ops": ops, "worst_abs_memory_error_vs_allocator": worst},
                              indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
