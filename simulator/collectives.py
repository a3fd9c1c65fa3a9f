"""Collective arithmetic and link bandwidths: the one place these rules live in the simulator.

* **Ring steps** — the latency steps of the ring algorithm over ``k`` ranks: ``2(k−1)`` for an
  all-reduce (a reduce-scatter then an all-gather), ``k−1`` for a reduce-scatter, an all-gather or
  a broadcast (pipelined along the ring), 1 for a point-to-point send (nccl-tests
  ``doc/PERFORMANCE.md``; NCCL's tuning model ``baseLat + nsteps · hwLat``).
* **Wire bytes** — what each rank sends for a buffer of ``n`` bytes: ``2(k−1)/k · n`` for an
  all-reduce, ``(k−1)/k · n`` for a reduce-scatter or an all-gather, ``n`` for a broadcast or a
  point-to-point send.
* **GEMM overlap** — a collective split into ``k`` chunks that pipeline with the ``k`` chunks of
  the GEMM beside it (Transformer Engine's userbuffers under ``tp_comm_overlap``: the all-gather
  before a column-parallel GEMM is a ring exchange of the ``tp`` sequence shards, each GEMM chunk
  starting when its shard arrives; the reduce-scatter after a row-parallel GEMM sends each output
  chunk as it is done; Wang et al., "Overlap Communication with Dependent Computation via
  Decomposition", ASPLOS'23, which TE implements). A two-stage pipeline of ``k`` equal chunks of
  communication ``C/k`` and compute ``G/k`` ends ``max(C, G) + min(C, G)/k`` after it starts, so the
  communication still exposed beyond the GEMM is ``max(C − G, 0) + min(C, G)/k``: one chunk when
  the GEMM is the longer, the whole excess when the collective is.
* **Link bandwidths** — bytes/s, one direction, of each link type of a cluster: a device's NVLink
  port (the cluster's intra-node override, else the catalog's NVLink, else its PCIe), a node's NIC
  (the cluster's inter-node override, else the catalog's per-device NIC × devices per node), a CPU
  host's loopback (the override, else :data:`DEFAULT_LOCAL_GBPS`), a device's PCIe link.

The topology, every communication model and calibration ask these functions.
"""

from __future__ import annotations

from mindpipe.traces.catalog import DeviceSpec
from mindpipe.traces.config import Cluster

OPS = ("allreduce", "reducescatter", "allgather", "p2p", "broadcast")
LINKS = ("nvlink", "nic", "pcie", "local")
# Loopback bandwidth between CPU ranks when nothing better is known (gloo over TCP on lo is a few
# GB/s on a small VM); calibration replaces it with a fitted figure.
DEFAULT_LOCAL_GBPS = 2.0


def ring_steps(op: str, k: int) -> int:
    """Latency steps of the ring algorithm for ``op`` over ``k`` ranks (module docstring)."""
    if op == "allreduce":
        return 2 * (k - 1)
    if op in ("reducescatter", "allgather", "broadcast"):
        return k - 1
    return 1


def wire_factor(op: str, k: int) -> float:
    """Bytes each rank sends per byte of the buffer for ``op`` over ``k`` ranks (module docstring)."""
    if op == "allreduce":
        return 2 * (k - 1) / k
    if op in ("reducescatter", "allgather"):
        return (k - 1) / k
    return 1.0


def wire_bytes(op: str, nbytes: float, k: int) -> float:
    """Bytes each rank sends for ``op`` of an ``nbytes`` buffer over ``k`` ranks (0 for a group of one)."""
    return wire_factor(op, k) * nbytes if k > 1 or op == "p2p" else 0.0


def overlapped_exposed_s(comm_s: float, gemm_s: float, chunks: int) -> float:
    """Seconds of a collective (``comm_s`` alone) still exposed when it pipelines in ``chunks``
    chunks with a GEMM of ``gemm_s`` seconds (module docstring): ``comm_s`` for one chunk or no GEMM."""
    if chunks <= 1 or gemm_s <= 0.0:
        return comm_s
    return max(comm_s - gemm_s, 0.0) + min(comm_s, gemm_s) / chunks


def link_type_capacities(cluster: Cluster, device: DeviceSpec) -> dict[str, float]:
    """Bytes/s (one direction) of one link of each type: a device's NVLink port, a node's NIC
    (all its NICs together), the loopback of a CPU node, a device's PCIe link."""
    nv = cluster.intra_node_bandwidth_GBps or device.nvlink_bandwidth_unidirectional_GBps or device.pcie_bandwidth_GBps
    nic_gbps = cluster.inter_node_bandwidth_Gbps or device.nic_bandwidth_Gbps * cluster.gpus_per_node
    return {"nvlink": nv * 1e9, "nic": nic_gbps * 1e9 / 8,
            "local": (cluster.intra_node_bandwidth_GBps or DEFAULT_LOCAL_GBPS) * 1e9,
            "pcie": device.pcie_bandwidth_GBps * 1e9}


def device_link_bandwidths(cluster: Cluster, device: DeviceSpec) -> dict[str, float]:
    """Per-device bytes/s of each link type: :func:`link_type_capacities` with the node's NIC
    shared by its devices (every device of a node sends at once in a collective), types without
    bandwidth left out."""
    caps = link_type_capacities(cluster, device)
    caps["nic"] /= cluster.gpus_per_node
    return {k: v for k, v in caps.items() if v > 0}


__all__ = [
    "DEFAULT_LOCAL_GBPS",
    "LINKS",
    "OPS",
    "device_link_bandwidths",
    "link_type_capacities",
    "overlapped_exposed_s",
    "ring_steps",
    "wire_bytes",
    "wire_factor",
]
