"""Refuse a run that cannot work, before any process starts.

Checks the plan against the model (:func:`mindpipe.traces.config.check_plan`), the world size, what the
executor supports, and the memory each pipeline rank needs (the simulator's memory model,
:func:`mindpipe.simulator.memory.stage_memory`) against the device's capacity. Every refusal is a
:class:`~mindpipe.traces.errors.ContractError` that names the plan and the rule. Torch-free: the launcher
runs this before it starts torchrun.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from mindpipe.simulator.memory import stage_memory
from mindpipe.simulator.schedules import build_schedule
from mindpipe.traces.catalog import DeviceSpec, get_device
from mindpipe.traces.config import Model, Plan, check_plan, stage_layers
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import block_policies

GIB = 2**30
# torch.distributed.pipelining class per schedule name of the plan (torch 2.13 names).
TORCH_SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved_1f1b": "Interleaved1F1B",
    "zb_h1": "InterleavedZeroBubble",
    "zbv": "ZBVZeroBubble",
    "dualpipev": "DualPipeV",
}

@dataclass
class Precheck:
    """What the checks decided.

    Attributes:
        schedule_source: ``torch`` or ``simulator`` (``auto`` resolved).
        memory_gib: Estimated peak per pipeline rank (None for a GPU missing from the catalog).
        capacity_gib: The device's memory.
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


def check_run(model: Model, plan: Plan, world_size: int, device_kind: str, device: DeviceSpec | None,
              schedule_source: str = "auto", text_data: bool = False, source: str = "plan",
              ranks_per_device: int = 1) -> Precheck:
    """Validate a run of ``plan`` on ``world_size`` ranks of a ``device_kind`` (``cpu``/``cuda``) device.

    ``device`` is its catalog entry (None for a GPU the catalog does not list: no memory check).
    ``ranks_per_device`` ranks share one device's memory (CPU ranks on one host share its RAM).

    Raises:
        ContractError: the plan is malformed for this model, needs another world size, asks for
            something the executor does not do, or does not fit in device memory.
    """

    def fail(key: str, rule: str) -> None:
        raise ContractError(source, key, rule)

    check_plan(plan, model, None, source=source)
    if plan.world_size != world_size:
        fail("dp", f"dp×tp×pp={plan.dp}×{plan.tp}×{plan.pp}={plan.world_size} ranks needed, the launch has {world_size}")
    if plan.precision == "fp16":
        fail("precision", "precision 'fp16' needs loss scaling, which the executor does not do; use bf16 or fp32")
    if model.vocab_size % plan.tp:
        fail("tp", f"tp={plan.tp} does not divide vocab_size={model.vocab_size} (vocabulary-parallel LM head)")
    if text_data and model.vocab_size < 256:
        fail("vocab_size", f"byte-level text needs vocab_size >= 256, the model has {model.vocab_size}")
    if "swap" in block_policies(plan, model.num_layers) and device_kind != "cuda":
        fail("layer_memory_policy", "'swap' offloads activations to host memory and needs a GPU")
    src = resolve_schedule_source(schedule_source, plan)
    m = plan.num_microbatches
    if plan.pp > 1 and plan.schedule in ("interleaved_1f1b", "zb_h1") and m % max(1, m // plan.pp):
        fail("global_batch_size", f"torch's {plan.schedule} runtime needs micro-batches m={m} to be a multiple of "
             f"max(1, m // pp)={max(1, m // plan.pp)}")
    if plan.pp > 1 and plan.schedule in ("dualpipev",) and m < plan.num_stages:
        fail("global_batch_size", f"dualpipev needs micro-batches m={m} >= stages={plan.num_stages}")
    notes: list[str] = []
    if plan.zero_stage in (1, 2):
        notes.append(f"zero_stage={plan.zero_stage} runs as FSDP2 without resharding after forward (ZeRO-2 semantics)")
    if plan.comm_priority != "fair":
        notes.append("comm_priority is a simulator policy; the executor runs torch's default stream priorities")
    if device is None:
        notes.append("memory pre-check skipped: this GPU is not in the hardware catalog")
        return Precheck(src, None, 0.0, notes)
    ranks = stage_memory(model, plan, device, build_schedule(plan.schedule, plan.pp, plan.num_microbatches,
                                                             plan.virtual_stages), stage_layers(plan, model))
    share = max(1, min(ranks_per_device, world_size))
    for r in ranks:
        if r.total_bytes * share > r.capacity_bytes:
            g = r.gib()
            shared = f" × {share} ranks sharing it" if share > 1 else ""
            raise ContractError(source, None, (
                f"pipeline rank {r.rank} needs an estimated {r.total_gib:.2f} GiB{shared} (simulator memory model: "
                f"weights {g['weights_gib']:.2f}, gradients {g['gradients_gib']:.2f}, optimizer {g['optimizer_gib']:.2f}, "
                f"activations {g['activations_gib']:.2f}, other {g['other_gib']:.2f}) but {device.name} has "
                f"{r.capacity_bytes / GIB:.2f} GiB; raise pp, tp or zero_stage, recompute, or lower micro_batch_size"))
    return Precheck(src, [r.total_gib for r in ranks], device.memory_capacity_bytes / GIB, notes)


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
    "TORCH_SCHEDULES",
    "Precheck",
    "catalog_device",
    "check_run",
    "detect_device",
    "env_world_size",
    "ranks_per_host",
    "resolve_schedule_source",
]
