"""Timing one unit of a model (a layer or a group of operators) forward and backward.

The backward pass is split into B (gradient w.r.t. the unit's inputs) and W (gradient w.r.t. its
weights), as zero-bubble schedules need (Qi et al., ICLR'24). B is timed as
``torch.autograd.grad(outputs, inputs)``; the full backward (inputs and weights, as in ordinary
training) is timed separately, and W = full − B. The same repeat interleaves both so slow drifts
of the machine affect them alike. Units without parameters have W = 0; units without float
inputs (the embedding) have B = 0. When the difference is lost in timing noise (its median is
not positive although W does FLOPs; seen on tiny units with few repeats), the full backward is
split by the FLOP counts of B and W instead, and ``stats["w_from_flops"]`` is 1.

Activation bytes are the distinct storages autograd saves during the unit's forward
(``torch.autograd.graph.saved_tensors_hooks``), excluding parameters and buffers, which are model
state, not activations.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

Outputs = tuple[torch.Tensor, ...]


@cache
def _attention_formulas() -> dict[Any, Any]:
    """FLOP formulas for fused attention kernels torch's counter lacks or gets wrong, in torch's own form
    (``sdpa_flop_count``: every query-key pair, as for the other fused kernels):

    * the CPU flash kernel (``_scaled_dot_product_flash_attention_for_cpu`` and its backward), which
      torch counts as 0: a ``profile --flash-attention`` trace on a CPU missed the attention core's
      FLOPs (s/(6h) of a block's);
    * under grouped-query attention, for torch releases whose formulas refuse K/V with fewer heads
      than Q (torch < 2.12 asserts "query/key/value shapes are incompatible"): K and V are counted
      as broadcast to the query's heads, as the kernels do.
    """
    from torch.utils import flop_counter as fcm

    try:
        fcm.sdpa_flop_count((1, 4, 2, 8), (1, 2, 2, 8), (1, 2, 2, 8))
        gqa_ok = True
    except AssertionError:
        gqa_ok = False

    def wide(kv: Any, q: Any) -> tuple[int, ...]:
        return (kv[0], q[1], *kv[2:])

    def fwd(q: Any, k: Any, v: Any, *_args: Any, **_kwargs: Any) -> int:
        return int(fcm.sdpa_flop_count(q, wide(k, q), wide(v, q)))

    def bwd(g: Any, q: Any, k: Any, v: Any, *_args: Any, **_kwargs: Any) -> int:
        return int(fcm.sdpa_backward_flop_count(g, q, wide(k, q), wide(v, q)))

    aten = torch.ops.aten
    names = {"_scaled_dot_product_flash_attention_for_cpu": fwd,
             "_scaled_dot_product_flash_attention_for_cpu_backward": bwd}
    if not gqa_ok:
        names |= {"_scaled_dot_product_flash_attention": fwd, "_scaled_dot_product_efficient_attention": fwd,
                  "_scaled_dot_product_cudnn_attention": fwd, "_scaled_dot_product_flash_attention_backward": bwd,
                  "_scaled_dot_product_efficient_attention_backward": bwd,
                  "_scaled_dot_product_cudnn_attention_backward": bwd}
    return {getattr(aten, n): f for n, f in names.items() if hasattr(aten, n)}


def flop_counter() -> FlopCounterMode:
    """torch's FLOP counter, able to count fused attention on a CPU and grouped-query attention on every
    supported torch (:func:`_attention_formulas`)."""
    return FlopCounterMode(display=False, custom_mapping=_attention_formulas())


class Clock:
    """Wall-clock on CPU; CUDA events (with synchronisation) on GPUs."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        """Wait for queued device work."""
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, fn: Callable[[], object]) -> float:
        """Seconds taken by ``fn`` on the device."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def median_iqr(values: Sequence[float]) -> tuple[float, float]:
    """Median and inter-quartile range of a sample."""
    vals = sorted(values)
    if len(vals) < 4:
        return statistics.median(vals), (vals[-1] - vals[0]) if vals else 0.0
    q = statistics.quantiles(vals, n=4)
    return statistics.median(vals), q[2] - q[0]


@dataclass
class UnitCost:
    """Measured costs of one unit for one micro-batch."""

    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    forward_flops: float
    backward_flops: float
    activation_bytes: int
    output_bytes: int
    stats: dict[str, float]


def _as_tuple(out: object) -> Outputs:
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, tuple | list):
        return tuple(t for t in out if isinstance(t, torch.Tensor))
    raise TypeError(f"unit returned {type(out).__name__}, expected tensors")


def tensor_bytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of distinct storages among ``tensors`` (views of one storage count once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        seen[t.untyped_storage().data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


def saved_activation_bytes(run: Callable[[], object], exclude: Sequence[torch.Tensor]) -> tuple[int, object]:
    """Run ``run`` once and return (bytes autograd saved for backward, its output)."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    return sum(saved.values()), out


def _count_flops(forward: Callable[[], Outputs], zero: Callable[[], None], grads: list[torch.Tensor],
                 grad_inputs: list[torch.Tensor]) -> tuple[int, int, int]:
    """FLOPs of the forward, the whole backward and its input-gradient part B (0 without inputs that need one)."""
    with flop_counter() as fc:
        o = forward()
    fwd_flops = fc.get_total_flops()
    with flop_counter() as fc:
        torch.autograd.backward(o, grads)
    bwd_flops = fc.get_total_flops()
    zero()
    b_flops = 0
    if grad_inputs and grads:
        o = forward()
        with flop_counter() as fc:
            torch.autograd.grad(o, grad_inputs, grads, allow_unused=True)
        b_flops = fc.get_total_flops()
    return fwd_flops, bwd_flops, b_flops


def _time_passes(forward: Callable[[], Outputs], zero: Callable[[], None], grads: list[torch.Tensor],
                 grad_inputs: list[torch.Tensor], has_weights: bool, clock: Clock, warmup: int,
                 repeats: int) -> tuple[list[float], list[float], list[float]]:
    """Timed repetitions of the forward, of B alone and of the whole backward (after ``warmup`` untimed ones)."""
    fwd_t: list[float] = []
    b_t: list[float] = []
    full_t: list[float] = []
    for i in range(warmup + repeats):
        clock.sync()
        t_f = clock.time(forward)
        t_b = 0.0
        if grad_inputs and grads:
            o = forward()
            clock.sync()
            t_b = clock.time(partial(torch.autograd.grad, o, grad_inputs, grads, allow_unused=True))
        t_full = 0.0
        if grads and (has_weights or grad_inputs):
            o = forward()
            zero()
            clock.sync()
            t_full = clock.time(partial(torch.autograd.backward, o, grads))
        if i >= warmup:
            fwd_t.append(t_f)
            b_t.append(t_b)
            full_t.append(t_full)
    return fwd_t, b_t, full_t


def _split_backward(fwd_t: list[float], b_t: list[float], full_t: list[float], has_weights: bool, has_inputs: bool,
                    bwd_flops: int, b_flops: int) -> tuple[tuple[float, float], tuple[float, float],
                                                           tuple[float, float], bool]:
    """Median and IQR of F, B and W (W = whole backward − B), and whether W had to come from the FLOP split.

    Without a weight gradient the whole backward is B; without an input gradient it is W. When the
    difference of two noisy timings leaves W ≤ 0 although W has FLOPs, the whole backward's median
    is split by their FLOPs instead.
    """
    if not has_weights:
        b_t = full_t if has_inputs else b_t  # the full-backward timing is the better sample of B
        w_t = [0.0] * len(b_t)
    elif not has_inputs:
        w_t, b_t = full_t, [0.0] * len(full_t)
    else:
        w_t = [f - b for f, b in zip(full_t, b_t, strict=True)]
    f_med, f_iqr = median_iqr(fwd_t)
    b_med, b_iqr = median_iqr(b_t)
    w_med, w_iqr = median_iqr(w_t)
    w_from_flops = has_weights and has_inputs and w_med <= 0.0 and bwd_flops > b_flops
    if w_from_flops:
        full_med, _ = median_iqr(full_t)
        w_med = full_med * (bwd_flops - b_flops) / bwd_flops
        b_med = full_med - w_med
    return (f_med, f_iqr), (b_med, b_iqr), (max(w_med, 0.0), w_iqr), w_from_flops


def measure_unit(
    fn: Callable[..., object],
    inputs: Sequence[object],
    params: Sequence[torch.nn.Parameter],
    clock: Clock,
    *,
    warmup: int = 2,
    repeats: int = 10,
    exclude_storages: Sequence[torch.Tensor] = (),
    seed: int = 0,
) -> UnitCost:
    """Time forward, B and W of ``fn(*inputs)`` and count its FLOPs and saved bytes.

    Args:
        fn: The unit; returns a tensor or a tuple of tensors.
        inputs: Its inputs; float tensors are detached and made to require grad.
        params: The unit's parameters (W is measured only if there are any that require grad).
        clock: Device clock.
        warmup: Untimed repetitions first.
        repeats: Timed repetitions (median reported, IQR in ``stats``).
        exclude_storages: Tensors whose storages are model state, not activations.
        seed: Seed for the random output gradients.
    """
    args = [
        a.detach().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
        for a in inputs
    ]
    grad_inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    weights = [p for p in params if p.requires_grad]
    state = list(params) + list(exclude_storages)

    act_bytes, out = saved_activation_bytes(lambda: fn(*args), state)
    outs = [o for o in _as_tuple(out) if o.requires_grad]
    gen = torch.Generator(device=outs[0].device if outs else "cpu").manual_seed(seed)
    grads = [
        torch.ones_like(o) if o.numel() == 1 else torch.randn(o.shape, generator=gen, device=o.device, dtype=o.dtype)
        for o in outs
    ]
    output_bytes = tensor_bytes(list(_as_tuple(out)))

    def forward() -> Outputs:
        return tuple(o for o in _as_tuple(fn(*args)) if o.requires_grad)

    def zero() -> None:
        for p in weights:
            p.grad = None

    fwd_flops, bwd_flops, b_flops = _count_flops(forward, zero, grads, grad_inputs)
    fwd_t, b_t, full_t = _time_passes(forward, zero, grads, grad_inputs, bool(weights), clock, warmup, repeats)
    zero()
    (f_med, f_iqr), (b_med, b_iqr), (w_med, w_iqr), w_from_flops = _split_backward(
        fwd_t, b_t, full_t, bool(weights), bool(grad_inputs), bwd_flops, b_flops)
    return UnitCost(
        forward_s=f_med,
        backward_input_s=b_med,
        backward_weight_s=w_med,
        forward_flops=float(fwd_flops),
        backward_flops=float(bwd_flops),
        activation_bytes=act_bytes,
        output_bytes=output_bytes,
        stats={
            "repeats": float(repeats),
            "forward_s_iqr": f_iqr,
            "backward_input_s_iqr": b_iqr,
            "backward_weight_s_iqr": w_iqr,
            "w_from_flops": float(bool(w_from_flops)),
        },
    )
