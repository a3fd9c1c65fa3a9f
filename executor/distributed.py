"""Process group, device and DeviceMesh of one rank.

The rank learns its place from torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``/``MASTER_PORT``), from SLURM's (``SLURM_PROCID``, ``SLURM_NTASKS``,
``SLURM_LOCALID``) when launched by ``srun``, or runs alone (world size 1, an in-memory store). CUDA
with NCCL is used when a GPU is present, CPU with gloo otherwise.

The mesh has named axes in Megatron order, outermost first: ``("pp", "dp", "tp")`` for the default
``rank_order`` ``tp-dp-pp`` (tp innermost, so tensor-parallel peers are neighbours on a node).
Other ``rank_order`` values permute the axes; names stay the same. A plan with context parallelism
(``cp`` > 1) has a ``cp`` axis right inside ``dp`` (Megatron-core's ``tp-cp-dp-pp``): the cp ranks of
one replica are consecutive along the replicas, as the simulator's topology lays them out, and the
gradients are reduced over dp·cp (:func:`replica_mesh`).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

AXES = ("pp", "dp", "tp", "cp")


@dataclass
class RankEnv:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    launcher: str  # torchrun, slurm or single


def rank_env() -> RankEnv:
    """Read the launcher's environment (torchrun, SLURM) or fall back to a single process."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return RankEnv(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0")), "torchrun")
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        # srun starts one task per rank; MASTER_ADDR/PORT must be exported by the job script.
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            if key not in env:
                raise ContractError("environment", key, f"{key} must be set when running under SLURM")
        return RankEnv(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", "0")), "slurm")
    return RankEnv(0, 1, 0, "single")


def pick_device(requested: str, local_rank: int) -> tuple[torch.device, str]:
    """(device, backend): CUDA + NCCL when requested/available, else CPU + gloo."""
    use_cuda = torch.cuda.is_available() if requested == "auto" else requested == "cuda"
    if use_cuda:
        if not torch.cuda.is_available():
            raise ContractError("--device", None, "--device cuda but no CUDA device is available")
        dev = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        return dev, "nccl"
    return torch.device("cpu"), "gloo"


def init_process_group(env: RankEnv, backend: str, device: torch.device, timeout_s: float) -> None:
    """Initialise the default process group with a timeout so a dead peer ends the run."""
    timeout = dt.timedelta(seconds=timeout_s)
    device_id = device if device.type == "cuda" else None
    if env.launcher == "single":
        # An in-memory store: a process alone needs no rendezvous, and a file store's file was left
        # in $TMPDIR by every single-process run (ranks leave without torch's teardown, which removes it).
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout,
                                device_id=device_id)
    else:
        dist.init_process_group(backend, rank=env.rank, world_size=env.world_size, timeout=timeout, device_id=device_id)


def mesh_shape(plan: Plan) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Mesh sizes and axis names, outermost first, from ``plan.rank_order`` (innermost first); ``cp``
    right inside ``dp`` when the plan has context parallelism."""
    inner_first = plan.rank_order.split("-")
    if plan.cp > 1:
        inner_first.insert(inner_first.index("dp"), "cp")
    order = list(reversed(inner_first))
    sizes = {"pp": plan.pp, "dp": plan.dp, "tp": plan.tp, "cp": plan.cp}
    return tuple(sizes[a] for a in order), tuple(order)


def build_mesh(plan: Plan, device: torch.device) -> DeviceMesh:
    """The (pp, dp, tp[, cp]) DeviceMesh over all ranks."""
    shape, names = mesh_shape(plan)
    return init_device_mesh(device.type, shape, mesh_dim_names=names)


def replica_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The ranks that hold the same weights and reduce their gradients together: the ``dp`` axis,
    or ``dp`` and ``cp`` flattened into one (``dp_cp``) under context parallelism (torchtitan's
    ``dp_shard_cp``). Made once per mesh (torch keeps the flattened mesh on its root)."""
    names = mesh.mesh_dim_names or ()
    if "cp" not in names:
        return mesh["dp"]
    try:
        return mesh["dp_cp"]
    except KeyError:
        return mesh["dp", "cp"]._flatten("dp_cp")


def coordinates(mesh: DeviceMesh) -> dict[str, int]:
    """This rank's index along each named axis (``cp`` 0 when the mesh has none)."""
    names = mesh.mesh_dim_names or ()
    return {a: mesh.get_local_rank(a) if a in names else 0 for a in AXES}


def host_name() -> str:
    """This machine's name."""
    return socket.gethostname()


__all__ = ["AXES", "RankEnv", "build_mesh", "coordinates", "init_process_group", "mesh_shape", "pick_device", "rank_env", "replica_mesh"]
