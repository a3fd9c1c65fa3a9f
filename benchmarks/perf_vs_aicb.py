"""Per-layer compute times: the GPU model vs AICB's A100 traces (GPT-13B/175B, LLaMA-7B/65B).

For every comparable AICB Megatron workload (see :mod:`mindpipe.simulator.perf.aicb` for what is comparable
and how LLaMA is mapped to a FLOP-equivalent GPT block) prints measured and predicted times per
transformer block — forward, and input + weight gradient — with the attention/MLP halves
alongside AICB's two row types, under both attention pricings (FlashAttention-2, which AICB's
kernels use, and Megatron's unfused baddbmm/softmax/bmm). Writes
``benchmarks/results/perf_vs_aicb.json``.

    .venv/bin/python benchmarks/perf_vs_aicb.py [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mindpipe.simulator.ops import block_ops
from mindpipe.simulator.perf import GpuComputeModel
from mindpipe.simulator.perf.aicb import AICB_CASES, case_model, compare_file, measured_parts
from mindpipe.traces.catalog import get_device

ATTENTION_OPS = ("ln1", "qkv", "attn_scores", "softmax", "attn_dropout", "attn_context", "flash_attn", "proj", "residual1")


def halves(model: GpuComputeModel, name: str, flash: bool) -> dict[str, float]:
    """Predicted forward seconds of the attention half and the MLP half of one block."""
    m, plan, _ = case_model(name, flash)
    ops = [o for o in block_ops(m, 1, m.seq_len, plan.tp, plan.sequence_parallel, 2, plan.flash_attention)
           if o.phase == "forward"]
    attn = sum(model.op_s(o, "bf16") for o in ops if o.name in ATTENTION_OPS)
    return {"attention": attn, "mlp": sum(model.op_s(o, "bf16") for o in ops) - attn}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "perf_vs_aicb.json"))
    args = ap.parse_args()
    d = Path(args.data) / "traces" / "aicb_a100"
    dev = get_device("a100-sxm4-80gb")
    peak = dev.peak_flops("bf16") / 1e12
    rows: list[dict[str, Any]] = []
    for flash in (True, False):
        model = GpuComputeModel(dev)
        print(f"\nattention priced as {'FlashAttention-2' if flash else 'baddbmm + softmax + bmm'} (times per block, µs)")
        print(f"{'file':54s} {'fwd meas':>9s} {'pred':>7s} {'err':>7s} {'bwd meas':>9s} {'pred':>7s} {'err':>7s} {'TFLOP/s':>8s}")
        for name in AICB_CASES:
            if not (d / name).is_file():
                continue
            c = compare_file(d / name, model, flash)
            pred_half, meas_half = halves(model, name, flash), measured_parts(d / name)
            rows.append({
                "file": name, "attention_pricing": "flash" if flash else "bmm", "family": c.family, "tp": c.tp,
                "sequence_parallel": c.sequence_parallel,
                "measured_forward_s": c.measured_forward_s, "predicted_forward_s": c.predicted_forward_s,
                "forward_error_percent": 100 * c.forward_error,
                "measured_backward_s": c.measured_backward_s, "predicted_backward_s": c.predicted_backward_s,
                "backward_error_percent": 100 * c.backward_error,
                "measured_forward_tflops": c.measured_tflops, "exceeds_a100_peak": c.measured_tflops > peak,
                "measured_rows_forward_s": meas_half, "predicted_halves_forward_s": pred_half,
            })
            flag = "  > peak!" if c.measured_tflops > peak else ""
            print(f"{name:54s} {c.measured_forward_s * 1e6:9.0f} {c.predicted_forward_s * 1e6:7.0f} {100 * c.forward_error:+6.1f}% "
                  f"{c.measured_backward_s * 1e6:9.0f} {c.predicted_backward_s * 1e6:7.0f} {100 * c.backward_error:+6.1f}% "
                  f"{c.measured_tflops:8.0f}{flag}")
            print(f"{'':54s} rows: attention {meas_half.get('attention', 0) * 1e6:.0f} vs {pred_half['attention'] * 1e6:.0f}, "
                  f"mlp {meas_half.get('mlp', 0) * 1e6:.0f} vs {pred_half['mlp'] * 1e6:.0f}")
    ok = [r for r in rows if r["attention_pricing"] == "flash" and not r["exceeds_a100_peak"]]
    mape_f = sum(abs(r["forward_error_percent"]) for r in ok) / len(ok)
    mape_b = sum(abs(r["backward_error_percent"]) for r in ok) / len(ok)
    summary = {"flash_files_within_peak": len(ok), "forward_mape_percent": mape_f, "backward_mape_percent": mape_b,
               "note": "GEMM ceiling solved on the GPT-175B forward (fit); every other number is a hold-out. AICB's "
                       "row split inside a block does not follow GEMM boundaries and its ig/wg columns repeat one "
                       "number; LLaMA is compared as a FLOP-equivalent GPT block (ffn x 1.5); files whose implied "
                       "TFLOP/s exceed the A100 peak cannot be A100 measurements of the stated shape."}
    print(f"\nflash pricing, files within the A100 peak: forward MAPE {mape_f:.1f}%, backward MAPE {mape_b:.1f}%")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": dev.name, "summary": summary, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
