"""Constants of the performance model that are not fitted here, with their sources.

:mod:`mindpipe.simulator.perf.fit` writes them, next to the fitted ones, into ``simulator/perf/data``.
``prior`` = a published figure or an engineering estimate (marked "estimate"; the end-to-end fit
of phase 2 may refine it), ``derived`` = counted from the algorithm, ``spec`` = vendor figure.
"""

from __future__ import annotations

from typing import Any

_GUIDE = "NVIDIA, Matrix Multiplication Background User's Guide (DU-09799-001, 2023)"
_NCCL_TUNING = "NCCL src/graph/tuning.cc (hwLat table, µs per step)"

COMPUTE_PRIORS: dict[str, dict[str, Any]] = {
    "gemm_efficiency_ceiling": {
        "value": 0.85, "unit": "fraction of dense peak FLOP/s", "method": "prior",
        "source": "fit target; prior 0.85: large fp16 cuBLAS GEMMs on A100 run at ~80-90% of 312 TFLOP/s (estimate)",
        "note": "what a full wave of the best tile reaches with unbounded K; shape effects come from tiles, waves and K",
    },
    "gemm_sustained_fraction": {
        "value": 0.859, "unit": 'fraction of dense peak FLOP/s', "method": 'prior',
        "source": 'S. Bekman, Machine Learning Engineering (github.com/stas00/ml-engineering, compute/accelerator/README.md), Maximum Achievable Matmul FLOPS comparison table: NVIDIA A100 SXM 267.9 of 312 TFLOP/s (85.9%), best of a shape scan (6912x16384x2048, CUDA 12.1)',
        "note": "an upper bound on every GEMM's rate: at the power limit the A100 holds ~1305 MHz, not the 1410 MHz boost of the spec peak (NVIDIA's HPL Rpeak); H100/H200 use their own measured value from devices.json instead (H100 SXM 792.1 of 989, 80.1%)",
    },
    "gemm_tiles": {
        "value": [[256, 128, 1.0], [128, 256, 1.0], [128, 128, 0.92], [128, 64, 0.8], [64, 128, 0.8], [64, 64, 0.6]],
        "unit": "[tile rows, tile cols, efficiency relative to the ceiling]", "method": "prior",
        "source": f"tile shapes: {_GUIDE}, §2.3 (typical cuBLAS tiles); relative efficiencies: estimate following the "
                  "guide's observation that larger tiles reuse operands more and run faster",
    },
    "gemm_k_overhead": {
        "value": 64, "unit": "K-steps per tile", "method": "prior",
        "source": "estimate: a multistage (cp.async) mainloop fills 2-3 stages of K=32 before its first MMA and writes "
                  "the C tile after the last; makes K=64..128 attention matmuls run at 50-67% of the tile rate",
    },
    "gemm_max_split_k": {
        "value": 8, "unit": "factor", "method": "prior",
        "source": "estimate: cuBLAS heuristics split K when the M×N grid leaves SMs idle; cap of the search",
    },
    "memory_bandwidth_efficiency": {
        "value": 0.8, "unit": "fraction of HBM peak bandwidth", "method": "prior",
        "source": "estimate: element-wise, normalisation and softmax kernels on A100 stream at ~75-90% of HBM peak",
    },
    "kernel_overhead_s": {
        "value": 2e-6, "unit": "s per kernel (GPU side)", "method": "prior",
        "source": "estimate: launch latency and ramp-up/tail of back-to-back kernels on one stream, a few µs on A100",
    },
    "host_overhead_per_kernel_s": {
        "value": 1e-5, "unit": "s of host time per launched kernel", "method": "prior",
        "source": "estimate: eager PyTorch + Megatron Python dispatch, order of 10 µs per kernel; bounds small layers; "
                  "the phase-2 end-to-end fit should refine it (or set 0 to disable)",
    },
    "flash_attention_efficiency": {
        "value": 0.6, "unit": "fraction of dense peak FLOP/s", "method": "prior",
        "source": "Dao, FlashAttention-2 (arXiv 2307.08691): 50-73% of A100 peak forward, less backward",
    },
    "optimizer_bytes_per_param": {
        "value": 54, "unit": "bytes of HBM traffic per parameter", "method": "derived",
        "source": "Megatron mixed-precision optimizer with fused Adam: grads 16->32 bit (2+4), unscale + inf check (4+4), "
                  "grad norm (4), Adam read p,g,m,v + write p,m,v (28), fp32 -> 16-bit params (4+2), zero grads (2)",
    },
}

_NV_UNITS = {
    "base_latency_s": ("s", "software fixed cost of one collective call (launch, host-side enqueue, completion)"),
    "step_latency_s": ("s per ring step", "per-hop latency; all-reduce has 2(k-1) steps"),
    "efficiency_max": ("fraction of link bandwidth", "asymptotic efficiency for large k and large messages (e_inf)"),
    "efficiency_group_penalty": ("dimensionless", "e_max(k) = e_inf (1 - c/k)"),
    "half_size_bytes": ("bytes", "n_half of the saturating curve 1 / (1 + (n_half/n)^gamma)"),
    "shape_exponent": ("dimensionless", "gamma of the saturating curve"),
}


def nvlink_record_template(key: str) -> dict[str, Any]:
    """Unit, source and note of a fitted NVLink curve constant (value and fit fields added by fit.py)."""
    unit, note = _NV_UNITS[key]
    return {"unit": unit, "source": "least squares on relative error of the in-place all-reduce time, "
                                    "vs. catalog NVLink 300 GB/s per direction", "note": note}


def _rec(value: float, unit: str, method: str, source: str, note: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"value": value, "unit": unit, "method": method, "source": source}
    if note:
        out["note"] = note
    return out


_SHAPE_FROM_NVLINK = "copied from the fitted NVLink curve (no data for this link; the size dependence is NCCL's, not the wire's)"
NCCL_PRIORS: dict[str, dict[str, Any]] = {
    "nic.base_latency_s": _rec(25e-6, "s", "prior", "fit.py copies the fitted NVLink base latency (software cost, not the link's)"),
    "nic.step_latency_s": _rec(6.6e-6, "s per ring step", "prior", f"{_NCCL_TUNING}: NET, ring, Simple protocol"),
    "nic.efficiency_max": _rec(0.92, "fraction of NIC line rate", "prior",
                               "estimate: NCCL inter-node busbw reaches ~90-95% of InfiniBand line rate"),
    "nic.efficiency_group_penalty": _rec(0.0, "dimensionless", "prior", "no data across nodes: no group-size effect assumed"),
    "nic.half_size_bytes": _rec(1e6, "bytes", "prior", _SHAPE_FROM_NVLINK),
    "nic.shape_exponent": _rec(0.5, "dimensionless", "prior", _SHAPE_FROM_NVLINK),
    "pcie.base_latency_s": _rec(25e-6, "s", "prior", "fit.py copies the fitted NVLink base latency"),
    "pcie.step_latency_s": _rec(5.7e-6, "s per ring step", "prior", f"{_NCCL_TUNING}: PCI, ring, Simple protocol"),
    "pcie.efficiency_max": _rec(0.8, "fraction of PCIe bandwidth", "prior",
                                "estimate: PCIe gen4 x16 moves ~25 of 32 GB/s per direction in practice"),
    "pcie.efficiency_group_penalty": _rec(0.0, "dimensionless", "prior", "no data: no group-size effect assumed"),
    "pcie.half_size_bytes": _rec(1e6, "bytes", "prior", _SHAPE_FROM_NVLINK),
    "pcie.shape_exponent": _rec(0.5, "dimensionless", "prior", _SHAPE_FROM_NVLINK),
    "local.base_latency_s": _rec(0.0, "s", "prior", "CPU ranks (gloo): as simulator.costs.AlphaBetaCommModel; calibration refits"),
    "local.step_latency_s": _rec(20e-6, "s per ring step", "prior", "as simulator.costs.AlphaBetaCommModel (gloo over loopback)"),
    "local.efficiency_max": _rec(0.5, "fraction of loopback bandwidth", "prior", "as simulator.costs.AlphaBetaCommModel"),
    "local.efficiency_group_penalty": _rec(0.0, "dimensionless", "prior", "no size or group effect for gloo"),
    "local.half_size_bytes": _rec(1.0, "bytes", "prior", "no size effect for gloo (curve flat above 1 byte)"),
    "local.shape_exponent": _rec(1.0, "dimensionless", "prior", "no size effect for gloo"),
    "tree.step_latency_s": _rec(7.5e-6, "s per tree level and direction", "prior", f"{_NCCL_TUNING}: NET, tree, LL128 protocol"),
    "tree.bandwidth_factor": _rec(0.9, "fraction of the ring's efficiency", "prior",
                                  "estimate: NCCL caps tree bandwidth below the ring's (tuning.cc per-channel tree caps)"),
    "tree.min_ranks": _rec(2, "ranks (nodes)", "prior",
                           "tree considered for all-reduce across >= 2 nodes; NCCL's tuner (min time) decides"),
}

__all__ = ["COMPUTE_PRIORS", "NCCL_PRIORS", "nvlink_record_template"]
