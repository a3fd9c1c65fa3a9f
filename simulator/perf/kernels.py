"""Time of one GPU kernel from its shape: GEMMs with tile and wave quantisation, memory-bound ops.

A GEMM ``C[M,N] = A[M,K]·B[K,N]`` runs as a grid of output tiles, one thread block (CTA) per
tile, at most one resident CTA per SM for the large tiles cuBLAS picks for training shapes. The
grid executes in *waves* of ``sm_count`` tiles; a partial last wave costs as much as a full one
(wave quantisation), and a tile that hangs over the matrix edge computes padding (tile
quantisation) — NVIDIA, *Matrix Multiplication Background User's Guide* (DU-09799-001, 2023),
§2.3 and §3. Each CTA streams its K dimension through the tensor cores; a fixed prologue/epilogue
(filling the software pipeline, writing C) costs ``k_overhead`` extra K-steps, which is what makes
the attention matmuls (K = head width, 64–128) run far below peak. Larger tiles reuse each loaded
operand more and run closer to the ceiling (the guide's Fig. 4); ``Tile.efficiency`` says how
close. cuBLAS's heuristic is modelled as an oracle that picks the fastest tile and split-K factor
(split-K only when the M×N grid alone leaves SMs idle; the fp32 partial sums are reduced in
memory).

Every kernel is also bounded below by its memory traffic at the achieved HBM bandwidth (the
roofline, Williams et al. 2009) and pays a fixed per-kernel overhead (launch and ramp). A GEMM is
also bounded by what the device sustains at all: its maximum achievable matmul FLOP/s (MAMF,
``sustained_fraction`` of peak). The spec peak assumes the boost clock on every SM, but a GPU that
keeps its tensor cores busy runs into its power limit and lowers the clock (NVIDIA rates the
A100's HPL peak at the 1,305 MHz it holds at 400 W, not the 1,410 MHz boost), so the best
measured GEMM of any shape stays below peak — 267.9 of 312 TFLOP/s (85.9 %) on an A100 SXM
(S. Bekman, *Machine Learning Engineering*, "Maximum Achievable Matmul FLOPS comparison table",
github.com/stas00/ml-engineering, ``compute/accelerator``). Small GEMMs never reach it (tiles and
waves limit them first); the large GEMMs of models at h ≥ 8,192 and low tensor parallelism do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# fp32 partial sums of split-K are written and read back once each.
_SPLIT_K_PARTIAL_BYTES = 4 * 2


@dataclass(frozen=True, slots=True)
class Tile:
    """A CTA output tile of ``rows``×``cols`` reaching ``efficiency`` of the GEMM ceiling."""

    rows: int
    cols: int
    efficiency: float


@dataclass(frozen=True, slots=True)
class KernelParams:
    """What pricing a kernel needs about the device and the software stack.

    Attributes:
        peak_flops: Dense peak FLOP/s for the dtype (the catalog's figure).
        sm_count: Streaming multiprocessors (tiles per wave).
        gemm_ceiling: Fraction of peak a full wave of the best tile reaches with unbounded K.
        tiles: Candidate tiles.
        k_overhead: Prologue/epilogue cost of one tile, in K-steps.
        max_split_k: Largest split-K factor considered (1 = none).
        bandwidth_Bps: Achieved HBM bandwidth (peak × efficiency) for memory-bound work.
        flash_efficiency: Fraction of peak a fused attention kernel reaches.
        kernel_overhead_s: Fixed GPU-side cost of every kernel (launch, ramp-up, tail).
        sustained_fraction: Largest fraction of ``peak_flops`` any GEMM sustains (the device's
            maximum achievable matmul FLOP/s; 1.0: no such bound).
    """

    peak_flops: float
    sm_count: int
    gemm_ceiling: float
    tiles: tuple[Tile, ...]
    k_overhead: float
    max_split_k: int
    bandwidth_Bps: float
    flash_efficiency: float
    kernel_overhead_s: float
    sustained_fraction: float = 1.0


def _split_k_factors(tiles_mn: int, sm_count: int, max_split_k: int) -> list[int]:
    """1, and the powers of two that still fit the grid in one wave of SMs."""
    out = [1]
    sk = 2
    while sk <= max_split_k and tiles_mn * sk <= sm_count:
        out.append(sk)
        sk *= 2
    return out


def gemm_compute_s(m: int, n: int, k: int, batch: int, tile: Tile, split_k: int, p: KernelParams) -> float:
    """Tensor-core time of a (batched) GEMM on one tile shape and split-K factor, no memory floor.

    ``waves × (2·rows·cols·(K/split + k_overhead)) / (per-SM rate × tile efficiency)``: every wave
    takes as long as one tile, whatever the fill of the last wave.
    """
    tiles = math.ceil(m / tile.rows) * math.ceil(n / tile.cols) * batch * split_k
    waves = math.ceil(tiles / p.sm_count)
    per_sm = p.peak_flops * p.gemm_ceiling * tile.efficiency / p.sm_count
    k_part = math.ceil(k / split_k)
    return waves * 2.0 * tile.rows * tile.cols * (k_part + p.k_overhead) / per_sm


def gemm_s(m: int, n: int, k: int, batch: int, dtype_bytes: int, p: KernelParams) -> float:
    """Time of one (batched) GEMM kernel: best tile and split-K, memory floor, sustained-rate floor,
    kernel overhead."""
    if min(m, n, k, batch) <= 0:
        return 0.0
    floor_s = max(dtype_bytes * batch * (m * k + k * n + m * n) / p.bandwidth_Bps,
                  2.0 * m * n * k * batch / (p.peak_flops * p.sustained_fraction))
    best = math.inf
    for tile in p.tiles:
        tiles_mn = math.ceil(m / tile.rows) * math.ceil(n / tile.cols) * batch
        for sk in _split_k_factors(tiles_mn, p.sm_count, p.max_split_k):
            t = gemm_compute_s(m, n, k, batch, tile, sk, p)
            if sk > 1:
                t += sk * m * n * batch * _SPLIT_K_PARTIAL_BYTES / p.bandwidth_Bps
            best = min(best, max(t, floor_s))
    return best + p.kernel_overhead_s


def gemm_efficiency(m: int, n: int, k: int, batch: int, dtype_bytes: int, p: KernelParams) -> float:
    """Achieved fraction of peak FLOP/s of :func:`gemm_s` (useful to read the model)."""
    t = gemm_s(m, n, k, batch, dtype_bytes, p)
    return 2.0 * m * n * k * batch / (t * p.peak_flops) if t > 0 else 0.0


def memory_s(nbytes: float, p: KernelParams) -> float:
    """A memory-bound kernel: its traffic at the achieved bandwidth, plus the kernel overhead."""
    return nbytes / p.bandwidth_Bps + p.kernel_overhead_s


def flash_s(flops: float, nbytes: float, p: KernelParams) -> float:
    """A fused attention kernel: FLOPs at ``flash_efficiency`` of peak, at least its traffic."""
    return max(flops / (p.peak_flops * p.flash_efficiency), nbytes / p.bandwidth_Bps) + p.kernel_overhead_s


__all__ = ["KernelParams", "Tile", "flash_s", "gemm_compute_s", "gemm_efficiency", "gemm_s", "memory_s"]
