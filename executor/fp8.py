"""FP8 training in the executor (plan precision ``fp8``): torchao's float8 linears on FP8-capable GPUs.

``precision: fp8`` means what the simulator prices (:mod:`mindpipe.simulator.perf.fp8`): the
transformer blocks' linear layers compute in FP8 with dynamic per-tensor scales, everything else in
bf16 (the bf16 mixed-precision policy of :mod:`mindpipe.executor.parallelize`). The executor runs it
with torchao (``torchao.float8.convert_to_float8_training``, pytorch/ao ``torchao/float8/README.md``),
which swaps each ``nn.Linear`` for a ``Float8Linear`` before the data-parallel wrapper is applied,
and only where the hardware has FP8 tensor cores: CUDA compute capability 8.9 or later (Ada,
Hopper). Everywhere else the plan is refused before launch with one line (:func:`fp8_refusal`).

torchao's casts to FP8 (each tensor's absolute maximum, its scale, the cast) are separate kernels in
eager mode: on an H200 (torch 2.11, torchao 0.17) a 4-block GPT at h 4096 trained in fp8 took 0.41 s
per iteration against 0.21 s in bf16. torchao's README asks for ``torch.compile`` for its speed, so
each ``Float8Linear`` is compiled (:func:`compile_modules`; nothing else is, so the rest of the model
runs as it does in bf16, which is what the simulator prices). ``MINDPIPE_FP8_COMPILE=0`` keeps them
eager.

Not applied: the LM head (it stays bf16, as Megatron's output layer does under Transformer
Engine), linears whose sizes are not multiples of 16 (torchao's FP8 GEMMs need them), and tensor
parallelism (torchao's float8 TP styles are not wired in): ``fp8`` with ``tp > 1`` is refused.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING

from mindpipe.traces.catalog import check_precision, fp8_tp_refusal
from mindpipe.traces.errors import ContractError

if TYPE_CHECKING:
    import torch
    from mindpipe.traces.catalog import DeviceSpec
    from mindpipe.traces.config import Plan
    from torch import nn

MIN_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (sm_89) and Hopper (sm_90) onwards
_SKIPPED = ("lm_head",)


def fp8_refusal(plan: Plan, device_kind: str, device: DeviceSpec | None) -> str | None:
    """Why the executor cannot run ``plan`` at precision ``fp8`` here (None when it can, or when
    the plan is not ``fp8``). Asks no GPU: the launcher does not import torch; the worker checks the
    compute capability again (:func:`convert_to_fp8`)."""
    if plan.precision != "fp8":
        return None
    if device_kind != "cuda":
        return (f"precision 'fp8' needs a CUDA GPU with FP8 tensor cores (compute capability >= 8.9) and torchao; "
                f"this run is on {device_kind} (use bf16)")
    if device is not None:
        try:
            check_precision("fp8", device.name)
        except ContractError as e:
            return e.rule
    if (tp_rule := fp8_tp_refusal(plan.precision, plan.tp)) is not None:
        return tp_rule
    if importlib.util.find_spec("torchao") is None:
        return "precision 'fp8' needs torchao (pip install torchao); it is not installed"
    return None


def _wanted(module: nn.Module, fqn: str) -> bool:
    from torch import nn

    if not isinstance(module, nn.Linear) or any(s in fqn for s in _SKIPPED):
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def convert_to_fp8(module: nn.Module, device: torch.device) -> int:
    """Swap the block linears of ``module`` for torchao ``Float8Linear`` (in place); returns how many.

    Raises:
        ContractError: the device is not CUDA with compute capability >= 8.9, or torchao is missing.
    """
    import torch

    if device.type != "cuda" or torch.cuda.get_device_capability(device) < MIN_CAPABILITY:
        cap = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
        raise ContractError("plan", "precision", f"precision 'fp8' needs compute capability >= 8.9; {device} has {cap}")
    try:
        from torchao.float8 import convert_to_float8_training
    except ImportError:
        raise ContractError("plan", "precision", "precision 'fp8' needs torchao, which does not import here") from None
    before = sum(1 for m in module.modules() if isinstance(m, torch.nn.Linear))
    convert_to_float8_training(module, module_filter_fn=_wanted)
    after = sum(1 for m in module.modules() if type(m) is torch.nn.Linear)
    if os.environ.get("MINDPIPE_FP8_COMPILE", "1") != "0":
        from torchao.float8.float8_linear import Float8Linear

        compile_modules(module, Float8Linear)
    return before - after


def compile_modules(module: nn.Module, kind: type, backend: str = "inductor") -> int:
    """``torch.compile`` every submodule of type ``kind`` in place (``nn.Module.compile``: the module
    object, its parameters and the hooks wrappers put on it stay the same); returns how many.

    Dynamo caches one graph per shape, shared by modules of the same type; its per-function cache
    limit is raised to the module count so a model with many linear shapes never falls back to eager.
    """
    import torch

    found = [m for m in module.modules() if isinstance(m, kind)]
    for m in found:
        m.compile(backend=backend)
    if found:
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, len(found))
    return len(found)


__all__ = ["MIN_CAPABILITY", "compile_modules", "convert_to_fp8", "fp8_refusal"]
