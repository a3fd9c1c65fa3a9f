"""FP8 GEMMs in the GPU kernel model (plan precision ``fp8``).

Transformer Engine's FP8 recipe (NVIDIA TE docs, "Using FP8 with Transformer Engine"; Micikevicius
et al., "FP8 Formats for Deep Learning", arXiv 2209.05433) and torchao's float8 training run the
transformer blocks' linear layers — QKV (or Q, K, V), the attention output projection, fc1/fc2 (or
gate, up, down) — as FP8 GEMMs (E4M3 operands forward, E5M2 gradients) with per-tensor scales,
and leave everything else in bf16: norms, element-wise ops, the attention core (FlashAttention in
bf16 in NeMo 24.07) and the LM head (Megatron's output layer is not a TE module). So under ``fp8``
the kernel model prices a block GEMM at the device's FP8 peak with 1-byte operands, and every other
operator exactly as under ``bf16``.

How close an FP8 GEMM comes to its peak is one number, ``fp8_gemm_efficiency`` in
``simulator/perf/data/fp8.json``: the family's 16-bit GEMM ceiling (tiles, waves, K overhead
unchanged) is scaled by it. It also absorbs TE's per-GEMM amax and cast kernels, which this model
does not list. Its provenance (prior or fit, with the fit rows) is in the file;
``python -m mindpipe.simulator.perf.nemo_fit`` regenerates it from the fit half of NVIDIA's NeMo
H100 FP8 table.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from mindpipe.simulator.ops import Op
from mindpipe.simulator.perf.constants import ConstantsFile, read_constants
from mindpipe.traces.errors import ContractError

FP8_FILE = "fp8.json"
FP8_KEY = "fp8_gemm_efficiency"
# GEMMs that stay bf16 under fp8: the LM head (Megatron's ColumnParallelLinear output layer).
BF16_GEMMS = ("lm_head",)


@dataclass(frozen=True, slots=True)
class Fp8Constants:
    """The FP8 GEMM constant and where it came from.

    Attributes:
        gemm_efficiency: Factor on the family's 16-bit GEMM ceiling at the FP8 peak, in (0, 1].
        source: The file it was read from.
    """

    gemm_efficiency: float
    source: str = ""

    def __post_init__(self) -> None:
        if not 0.0 < self.gemm_efficiency <= 1.0:
            raise ContractError(self.source or "fp8", FP8_KEY, f"{FP8_KEY}={self.gemm_efficiency} must be in (0, 1]")

    @classmethod
    def from_file(cls, cf: ConstantsFile) -> Fp8Constants:
        """Read from a parsed constants file holding ``fp8_gemm_efficiency``."""
        return cls(cf.number(FP8_KEY), cf.source)


def read_fp8_constants(path: str | Path | None = None) -> Fp8Constants:
    """The FP8 constants from ``path`` (a user's fit), or the shipped ``fp8.json``."""
    return Fp8Constants.from_file(read_constants(path) if path is not None else read_constants(shipped=FP8_FILE))


@functools.lru_cache(maxsize=1)
def shipped_fp8_constants() -> Fp8Constants:
    """The shipped FP8 constants (cached)."""
    return read_fp8_constants()


def is_fp8_gemm(op: Op) -> bool:
    """True for an operator that runs in FP8 under plan precision ``fp8``: a block's linear-layer GEMM."""
    return op.kind == "gemm" and op.gemm_mnk is not None and not op.name.startswith(BF16_GEMMS)


def cast_bytes(op: Op) -> float:
    """HBM traffic of the cast a FP8 GEMM needs before it runs, 0 for other operators.

    Transformer Engine casts a GEMM's bf16 activation operand to FP8 with one fused
    cast-and-transpose kernel (``transformer_engine/common/transpose/cast_transpose.cu``): it reads the
    M×K bf16 tensor (2 B) and writes its FP8 copy and the copy's transpose (1 B each) — the forward's
    input X (kept transposed for the weight gradient) and the backward's output gradient dY (the
    weight-gradient GEMM then reuses both casts, so it needs none). Weights are cast once per
    iteration and cached across micro-batches (not counted).
    """
    if not is_fp8_gemm(op) or op.phase == "backward_weight" or op.gemm_mnk is None:
        return 0.0
    m, _, k = op.gemm_mnk
    return 4.0 * m * k * op.batch


__all__ = ["BF16_GEMMS", "FP8_FILE", "FP8_KEY", "Fp8Constants", "cast_bytes", "is_fp8_gemm", "read_fp8_constants",
           "shipped_fp8_constants"]
