"""Shape-aware GPU compute model: per-operator kernel times from FLOPs, bytes and GEMM shapes.

Prices the operators of :mod:`mindpipe.simulator.ops` (one :class:`~mindpipe.simulator.ops.Op` = one kernel) with
:mod:`mindpipe.simulator.perf.kernels` — tile and wave quantised GEMMs with an efficiency ceiling and a
memory floor, batched GEMMs for Megatron's attention, memory-bound operators at a fraction of HBM
bandwidth, a fixed overhead per kernel — and adds one bound the GPU alone does not see: eager
PyTorch issues kernels from one host thread, so a phase of a layer cannot finish faster than
``kernels × host_overhead_per_kernel_s`` (small models at small micro-batches are launch-bound;
e.g. Lin et al., "Understanding the overheads of launching CUDA kernels", ICPP'19 poster, and the
motivation of CUDA graphs in Megatron-LM). The host runs ahead of the GPU, so per phase the time
is the larger of the two sums, not their sum.

Constants come per GPU family from ``simulator/perf/data`` (see :mod:`mindpipe.simulator.perf.constants`);
GPUs without a fit of their own (H100, H200) use the A100 curves with their own peak FLOP/s, SM
count and memory bandwidth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mindpipe.simulator.costs import DTYPE_BYTES, GEMM_OPERAND_BYTES, NON_GEMM_PRECISION, LayerCost, op_layer_costs
from mindpipe.simulator.ops import Op
from mindpipe.simulator.perf.constants import GpuConstants, facts_for, shipped_constants, sustained_fraction_for
from mindpipe.simulator.perf.fp8 import Fp8Constants, cast_bytes, is_fp8_gemm, shipped_fp8_constants
from mindpipe.simulator.perf.kernels import KernelParams, flash_s, gemm_s, memory_s
from mindpipe.traces.catalog import DeviceSpec
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.errors import ContractError

# Kernels of one mixed-precision optimizer step (Megatron's FP16 optimizer with a fused Adam):
# copy/unscale grads, inf check, grad norm, Adam, copy fp32 params back to 16-bit, zero grads.
_OPTIMIZER_KERNELS = 6


@dataclass(frozen=True, slots=True)
class PhaseTimes:
    """Seconds of one layer's phases for one micro-batch, and the attention-core forward."""

    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    attention_core_s: float


@dataclass
class GpuComputeModel:
    """Implements :class:`mindpipe.simulator.costs.ComputeModel` for GPUs from shapes and fitted constants.

    Attributes:
        device: Catalog entry (peak FLOP/s per dtype, memory bandwidth).
        constants: Compute constants; default: the shipped file for the device's family.
        sm_count: SMs; default: ``devices.json`` (A100 108, H100/H200 132).
        host_bound: Apply the host kernel-issue bound (turn off to see GPU time alone).
        fp8: FP8 GEMM constant for plan precision ``fp8`` (:mod:`mindpipe.simulator.perf.fp8`);
            default: the shipped ``fp8.json``.
    """

    device: DeviceSpec
    constants: GpuConstants | None = None
    sm_count: int | None = None
    host_bound: bool = True
    fp8: Fp8Constants | None = None
    sm_count_source: str = field(default="", init=False)
    _params: dict[str, KernelParams] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.device.kind != "gpu":
            raise ContractError(self.device.name, "kind", "GpuComputeModel needs a GPU; use RooflineComputeModel on CPUs")
        sms, compute_file, _, how = facts_for(self.device)
        if self.sm_count is None:
            self.sm_count, self.sm_count_source = sms, how
        else:
            self.sm_count_source = "given"
        if self.constants is None:
            self.constants = GpuConstants.from_file(shipped_constants(compute_file))

    @property
    def c(self) -> GpuConstants:
        """The constants in use."""
        if self.constants is None:  # only if __post_init__ was bypassed
            raise ContractError(self.device.name, "constants", "GpuComputeModel has no constants")
        return self.constants

    def kernel_params(self, precision: str) -> KernelParams:
        """Kernel-pricing parameters for a dtype (cached)."""
        p = self._params.get(precision)
        if p is None:
            c = self.c
            ceiling = c.gemm_ceiling
            if precision == "fp8":  # FP8 GEMMs: the family's ceiling scaled (mindpipe.simulator.perf.fp8)
                ceiling *= (self.fp8 or shipped_fp8_constants()).gemm_efficiency
            p = self._params[precision] = KernelParams(
                peak_flops=self.device.peak_flops(precision),
                sm_count=int(self.sm_count or 1),
                gemm_ceiling=ceiling,
                tiles=c.tiles,
                k_overhead=c.k_overhead,
                max_split_k=c.max_split_k,
                bandwidth_Bps=self.device.memory_bandwidth_GBps * 1e9 * c.memory_bandwidth_efficiency,
                flash_efficiency=c.flash_attention_efficiency,
                kernel_overhead_s=c.kernel_overhead_s,
                # The device's own measured bound where devices.json has one (H100/H200), else the file's.
                sustained_fraction=sustained_fraction_for(self.device) or c.gemm_sustained_fraction,
            )
        return p

    def op_s(self, op: Op, precision: str) -> float:
        """GPU time of one operator (kernel).

        Under ``fp8`` a block's linear GEMM runs at the FP8 peak with 1-byte operands, after the
        cast of its activation operand (:func:`~mindpipe.simulator.perf.fp8.cast_bytes`, memory-bound);
        every other operator at the 16-bit precision beside it (:data:`~mindpipe.simulator.costs.NON_GEMM_PRECISION`).
        """
        if precision in NON_GEMM_PRECISION:
            p16 = self.kernel_params(NON_GEMM_PRECISION[precision])
            if is_fp8_gemm(op) and op.gemm_mnk is not None:
                m, n, k = op.gemm_mnk
                cast = cast_bytes(op)
                return (gemm_s(m, n, k, op.batch, GEMM_OPERAND_BYTES[precision], self.kernel_params(precision))
                        + (memory_s(cast, p16) if cast else 0.0))
            precision = NON_GEMM_PRECISION[precision]
        p = self.kernel_params(precision)
        if op.kind in ("gemm", "bmm") and op.gemm_mnk is not None:
            m, n, k = op.gemm_mnk
            return gemm_s(m, n, k, op.batch, DTYPE_BYTES[precision], p)
        if op.kind == "flash":
            return flash_s(op.flops, op.bytes, p)
        return memory_s(op.bytes, p)

    def _bounded(self, gpu_s: float, kernels: int) -> float:
        return max(gpu_s, kernels * self.c.host_overhead_per_kernel_s) if self.host_bound else gpu_s

    def phase_times(self, ops: Sequence[Op], precision: str) -> PhaseTimes:
        """Per-phase time of a layer's operators (GPU sum, bounded below by host kernel issue)."""
        gpu = {"forward": 0.0, "backward_input": 0.0, "backward_weight": 0.0}
        count = dict.fromkeys(gpu, 0)
        core_s, core_n = 0.0, 0
        for op in ops:
            t = self.op_s(op, precision)
            gpu[op.phase] += t
            count[op.phase] += 1
            if op.attention_core and op.phase == "forward":
                core_s += t
                core_n += 1
        f, i, w = (self._bounded(gpu[k], count[k]) for k in ("forward", "backward_input", "backward_weight"))
        return PhaseTimes(f, i, w, self._bounded(core_s, core_n))

    def layer_costs(self, model: Model, plan: Plan) -> list[LayerCost]:
        """Per-layer costs in pipeline order (embedding, blocks…, final_norm, lm_head)."""

        def price(ops: Sequence[Op]) -> tuple[float, float, float, float]:
            pt = self.phase_times(ops, plan.precision)
            return pt.forward_s, pt.backward_input_s, pt.backward_weight_s, pt.attention_core_s

        return op_layer_costs(model, plan, price)

    def optimizer_step_s(self, params_per_device: int, plan: Plan) -> float:
        """Mixed-precision Adam: memory-bound over the optimizer's bytes per parameter.

        The step streams every parameter's fp32 state through a few multi-tensor kernels, each
        over up to gigabytes in long contiguous chunks (apex/DeepSpeed ``multi_tensor_apply``), so it
        runs at its own achieved share of HBM bandwidth, ``optimizer_bandwidth_efficiency`` —
        not the ``memory_bandwidth_efficiency`` of a layer's small activation kernels (a few MB
        each, where launch ramp and tail weigh). Files without that constant use the latter.
        """
        p = self.kernel_params(plan.precision)
        eff = self.c.optimizer_bandwidth_efficiency
        bw = p.bandwidth_Bps if eff is None else self.device.memory_bandwidth_GBps * 1e9 * eff
        return params_per_device * self.c.optimizer_bytes_per_param / bw + _OPTIMIZER_KERNELS * p.kernel_overhead_s


__all__ = ["GpuComputeModel", "PhaseTimes"]
