"""Refuse a run that cannot work, before any process starts.

Checks the plan against the model (:func:`mindpipe.traces.config.check_plan`), against what it was
tuned for (``plan.made_for``: another device kind or number of devices is refused with what it
was made for), the world size, what the executor supports, and — when the caller gives a memory
check — the memory each pipeline rank needs against the device's capacity. Every refusal is a
:class:`~mindpipe.traces.errors.ContractError` that names the plan and the rule. Torch-free: the
launcher runs this before it starts torchrun.

The memory model is the simulator's, which the executor does not import (DESIGN.md: the
executor depends on ``traces`` and the simulator's pure schedule modules only). ``mindpipe run``
injects it as ``memory_check`` (built on ``Simulator.refuse_unless_fits``); ``python -m
mindpipe.executor`` started directly under torchrun has none, and then no memory check runs (a
note says so).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from mindpipe.executor.clocks import ACTION_CPU_NOTICE, CPU_NOTICE
from mindpipe.executor.fp8 import fp8_refusal
from mindpipe.traces.catalog import DeviceSpec, get_device
from mindpipe.traces.config import Model, Plan, check_plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.frequency import check_action_clocks, check_stage_clocks
from mindpipe.traces.layout import block_policies
from mindpipe.traces.result import GIB
from mindpipe.traces.what_if import WHAT_IF_KEYS, plan_value, what_if_used

# torch.distributed.pipelining class per schedule name of the plan (torch 2.13 names).
TORCH_SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved_1f1b": "Interleaved1F1B",
    "zb_h1": "InterleavedZeroBubble",
    "zbv": "ZBVZeroBubble",
    "dualpipev": "DualPipeV",
}
# torch's choice of kernel for scaled_dot_product_attention (traces/torch_gpt.py flash_core).
FLASH_DROPOUT_CPU_NOTICE = ("flash_attention with attention dropout on a CPU: torch runs its math backend for "
                            "scaled_dot_product_attention, which saves the a·s² probabilities like the explicit core; "
                            "the measured activations are not the fused kernel's")
CPU_BF16_NOTICE = ("precision bf16 on a CPU without bf16 matrix instructions (neither avx512_bf16 nor amx_bf16 in "
                   "/proc/cpuinfo): torch emulates its bf16 GEMMs, several times slower than fp32, while the simulator's "
                   "cpu device assumes them; precision fp32 (tune --fix precision=fp32) runs faster on this host")
# (model, plan, catalog device, ranks sharing one device) -> estimated peak GiB per pipeline rank;
# raises ContractError when a rank does not fit.
MemoryCheck = Callable[[Model, Plan, DeviceSpec, int], list[float]]


@dataclass
class Precheck:
    """What the checks decided.

    Attributes:
        schedule_source: ``torch`` or ``simulator`` (``auto`` resolved).
        memory_gib: Estimated peak per pipeline rank from the injected memory check (None when
            no check ran: no ``memory_check`` given, or a GPU missing from the catalog).
        capacity_gib: The device's memory (0 when the device is not in the catalog).
        notes: Non-fatal remarks (printed by the launcher).
    """

    schedule_source: str
    memory_gib: list[float] | None
    capacity_gib: float
    notes: list[str]


def resolve_schedule_source(requested: str, plan: Plan) -> str:
    """``auto`` → the simulator's action table when there is a pipeline, else torch's single stage."""
    if requested != "auto":
        return requested
    return "torch" if plan.pp == 1 else "simulator"


def check_made_for(plan: Plan, world_size: int, device_kind: str, source: str = "plan") -> None:
    """Refuse a launch that does not match what a tuned plan was made for (``plan.made_for``).

    Raises:
        ContractError: a plan tuned for GPUs launched on a CPU (or the reverse), or on another
            number of ranks; the message states what the plan was tuned for.
    """
    made = plan.made_for
    if made is None:
        return
    tuned_gpu = get_device(made.cluster.gpu).kind == "gpu"
    if tuned_gpu != (device_kind == "cuda"):
        here = "CUDA GPUs" if device_kind == "cuda" else "the CPU"
        raise ContractError(source, "made_for", f"the plan was tuned for {made.describe()}, "
                            f"{'GPUs' if tuned_gpu else 'CPUs'}; this launch runs on {here}")
    if plan.world_size != world_size:
        mesh = "×".join(str(getattr(plan, k)) for k in ("dp", "tp", "pp", "cp") if k != "cp" or plan.cp > 1)
        edited = ", so it was edited since" if made.cluster.world_size != plan.world_size else ""
        raise ContractError(source, "dp", f"{'dp×tp×pp×cp' if plan.cp > 1 else 'dp×tp×pp'}={mesh}={plan.world_size} "
                            f"ranks needed, this launch has {world_size}; the plan was tuned for "
                            f"{made.describe()}{edited}")


def what_if_notes(plan: Plan) -> list[str]:
    """A note naming the plan's what-if knobs: keys the simulator models but the executor does not carry out."""
    why = {"comm_priority": "torch's default stream priorities run",
           "overlap_grad_reduce": "torch.distributed.pipelining reduces a stage's gradients after its last backward",
           "tp_comm_overlap": "DTensor tensor parallelism issues its collectives between the GEMMs",
           "overlap_param_gather": "FSDP2 gathers the parameters before the forward",
           "blocking_p2p": "torch.distributed.pipelining's runtime leaves sends in flight until the step's end",
           "fused_elementwise": "the executor runs RMSNorm, the rotary embedding and SwiGLU as eager PyTorch kernels",
           "dp_impl": "the executor's data parallelism is FSDP2 (replicate / fully_shard)"}
    knobs = {key: f"{key}={plan_value(getattr(plan, key))} ({why.get(key, 'simulated only')}; the measurement "
                  f"records {plan_value(WHAT_IF_KEYS[key])})" for key in what_if_used(plan)}
    for key in plan.made_for.what_if if plan.made_for is not None else []:
        knobs.setdefault(key, f"{key}={json.dumps(getattr(plan, key, None))} (made_for.what_if)")
    if not knobs:
        return []
    return ["what-if knobs the simulator models but the executor does not carry out: " + "; ".join(knobs.values())]


def cpu_has_bf16_gemm(cpuinfo: str = "/proc/cpuinfo") -> bool | None:
    """Whether this host's CPU has bf16 matrix instructions (AVX512_BF16 or AMX-BF16); None where unknown.

    Without them torch's CPU bf16 matmul is emulated: on an AVX2-only EPYC host, measured at
    about 1 GFLOP/s against 108 for fp32 (a gpt-tiny-8k pp2 run: 252 against 2,149 tokens/s).
    Read from the kernel's flags (Linux) so the launcher need not import torch.
    """
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.partition(":")[2].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        return None
    return None


def check_run(model: Model, plan: Plan, world_size: int, device_kind: str, device: DeviceSpec | None,
              schedule_source: str = "auto", text_data: bool = False, source: str = "plan",
              ranks_per_device: int = 1, memory_check: MemoryCheck | None = None,
              memory_budget_gib: float | None = None) -> Precheck:
    """Validate a run of ``plan`` on ``world_size`` ranks of a ``device_kind`` (``cpu``/``cuda``) device.

    ``device`` is its catalog entry (None for a GPU the catalog does not list: no memory check).
    ``ranks_per_device`` ranks share one device's memory (CPU ranks on one host share its RAM).
    ``memory_check`` estimates each pipeline rank's peak memory and refuses a plan that does not
    fit (``mindpipe run`` passes the simulator's); None runs no memory check (the notes say so).
    ``memory_budget_gib`` replaces the device's capacity with that of an emulated device of its
    own per rank (``--memory-budget-gib``): the memory check refuses a plan over it.

    Raises:
        ContractError: the plan is malformed for this model, was tuned for another device kind
            or size, needs another world size, asks for something the executor does not do, or
            does not fit in device memory.
    """

    src = _refuse(model, plan, world_size, device_kind, device, text_data, schedule_source, source)
    notes = _notes(model, plan, device_kind, device, source)
    if device is not None and memory_budget_gib is not None:
        device = dataclasses.replace(device, memory_capacity_bytes=int(memory_budget_gib * GIB))
        ranks_per_device = 1  # each rank emulates a device of its own
    if device is None:
        notes.append("memory pre-check skipped: this GPU is not in the hardware catalog")
        return Precheck(src, None, 0.0, notes)
    if plan.made_for is not None and plan.made_for.cluster.gpu != device.name:
        notes.append(f"the plan was tuned for {plan.made_for.describe()}; this run is on {device.name}")
    capacity = device.memory_capacity_bytes / GIB
    if memory_check is None:
        notes.append("memory pre-check skipped: the caller gave no memory model (the simulator's, which the "
                     "executor does not import)")
        return Precheck(src, None, capacity, notes)
    try:
        gib = memory_check(model, plan, device, max(1, min(ranks_per_device, world_size)))
    except ContractError as e:
        emulated = f" (emulated by --memory-budget-gib {memory_budget_gib:g})" if memory_budget_gib is not None else ""
        raise ContractError(source, e.key, e.rule + swap_hint(model, plan) + emulated) from None
    return Precheck(src, gib, capacity, notes)


def _refuse(model: Model, plan: Plan, world_size: int, device_kind: str, device: DeviceSpec | None, text_data: bool,
            schedule_source: str, source: str) -> str:
    """:func:`check_run`'s refusals: what the plan, the launch or this executor's runtime cannot run;
    the resolved schedule source (:func:`resolve_schedule_source`)."""

    def fail(key: str, rule: str) -> NoReturn:
        raise ContractError(source, key, rule)

    check_plan(plan, model, None, source=source)
    check_made_for(plan, world_size, device_kind, source)
    if plan.world_size != world_size:
        fail("dp", f"{plan.mesh_text}={plan.world_size} ranks needed, the launch has {world_size}")
    if plan.precision == "fp16":
        fail("precision", "precision 'fp16' needs loss scaling, which the executor does not do; use bf16 or fp32")
    fp8 = fp8_refusal(plan, device_kind, device)
    if fp8 is not None:
        fail("precision", fp8)
    if text_data and model.vocab_size < 256:
        fail("vocab_size", f"byte-level text needs vocab_size >= 256, the model has {model.vocab_size}")
    src = resolve_schedule_source(schedule_source, plan)
    # The micro-batch rules (interleaved 1F1B's whole groups of pp, DualPipeV's m >= 2·pp:
    # traces.schedule_rules.microbatch_rule; ZB-H1's equal rounds in torch's runtime:
    # runtime_microbatch_rule) are checked by check_plan above, so the simulator and the tuner
    # refuse what this runtime cannot run.
    return src


def _notes(model: Model, plan: Plan, device_kind: str, device: DeviceSpec | None, source: str) -> list[str]:
    """:func:`check_run`'s notices: what the run will do differently from the plan, and why."""
    notes: list[str] = []
    if plan.zero_stage in (1, 2):
        notes.append(f"zero_stage={plan.zero_stage} runs as FSDP2 without resharding after forward (ZeRO-2 semantics)")
    notes += what_if_notes(plan)
    if plan.precision == "bf16" and device_kind == "cpu" and cpu_has_bf16_gemm() is False:
        notes.append(CPU_BF16_NOTICE)
    if plan.flash_attention and model.dropout and device_kind != "cuda":
        notes.append(FLASH_DROPOUT_CPU_NOTICE)
    if plan.stage_clocks_mhz is not None:
        if device_kind != "cuda":
            notes.append(CPU_NOTICE)
        elif device is not None:
            check_stage_clocks(plan.stage_clocks_mhz, device.name, source)
    if plan.action_clocks_mhz is not None:
        if device_kind != "cuda":
            notes.append(ACTION_CPU_NOTICE)
        elif device is not None:
            check_action_clocks(plan.action_clocks_mhz, device.name, source)
    return notes


def swap_hint(model: Model, plan: Plan) -> str:
    """What a memory refusal adds next to recompute when ``plan`` swaps no block: vPipe's third choice.

    A swapped block keeps none of its activations on the device between its forward and its
    backward (:mod:`mindpipe.executor.offload`; on a CPU, a host pool the device accounting does not
    count). Empty when a block already swaps.
    """
    if "swap" in block_policies(plan, model.num_layers):
        return ""
    return ('; or swap blocks to host memory (layer_memory_policy "swap" per block, or let '
            "mindpipe tune --partitioner vpipe,dawnpiper choose keep/recompute/swap per block)")


def detect_device(requested: str) -> tuple[str, str | None]:
    """(``cpu``|``cuda``, GPU name) for ``--device`` without importing torch (asks ``nvidia-smi``).

    Raises:
        ContractError: ``--device cuda`` on a machine without an NVIDIA GPU.
    """
    name = None
    exe = shutil.which("nvidia-smi") if requested != "cpu" else None
    if exe:
        try:
            out = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=30, check=False)
            lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()] if out.returncode == 0 else []
            name = lines[0] if lines else None
        except (OSError, subprocess.TimeoutExpired):
            name = None
    if requested == "cuda" and name is None:
        raise ContractError("--device", None, "--device cuda but nvidia-smi finds no GPU")
    return ("cuda", name) if name is not None else ("cpu", None)


def env_world_size() -> int:
    """World size from torchrun's or SLURM's environment (1 when launched alone)."""
    for key in ("WORLD_SIZE", "SLURM_NTASKS"):
        if key in os.environ:
            return int(os.environ[key])
    return 1


def env_rank() -> int:
    """This process's global rank from torchrun's or SLURM's environment (0 when launched alone)."""
    for key in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(key, "")
        if value.isdecimal():
            return int(value)
    return 0


def ranks_per_host() -> int:
    """Ranks on this host (torchrun's ``LOCAL_WORLD_SIZE``, SLURM's tasks per node; 1 alone)."""
    for key in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(key, "")
        if value.isdecimal():
            return int(value)
    return 1


def catalog_device(kind: str, cuda_name: str | None = None) -> DeviceSpec | None:
    """The catalog entry of this machine's device: ``cpu``, or the GPU named by CUDA (None if unlisted)."""
    if kind == "cpu":
        return get_device("cpu")
    name = (cuda_name or "").upper()
    for needle, key in (("H200", "h200-sxm-141gb"), ("H100", "h100-sxm5-80gb"), ("A100-SXM4-80GB", "a100-sxm4-80gb"),
                        ("A100 80GB", "a100-sxm4-80gb"), ("A100", "a100-sxm4-40gb")):
        if needle in name:
            return get_device(key)
    return None


__all__ = [
    "CPU_BF16_NOTICE",
    "FLASH_DROPOUT_CPU_NOTICE",
    "TORCH_SCHEDULES",
    "MemoryCheck",
    "Precheck",
    "catalog_device",
    "check_made_for",
    "check_run",
    "cpu_has_bf16_gemm",
    "detect_device",
    "env_rank",
    "env_world_size",
    "ranks_per_host",
    "resolve_schedule_source",
    "swap_hint",
    "what_if_notes",
]
