"""Where ranks live and which links a transfer crosses.

Ranks are placed on nodes in Megatron's default order — tensor-parallel innermost, then data,
then pipeline (``rank_order="tp-dp-pp"``; Narayanan et al. SC'21 §3.2: keep TP inside a node) —
unless the plan names another order. Global rank ``g`` lives on node ``g // gpus_per_node``.
Under context parallelism the ``dp`` axis holds dp·cp ranks, the cp ranks of one replica
consecutive (Megatron-core's ``tp-cp-dp-pp``): gradients are reduced over the whole axis, the
``cp`` group is its first cp members.

Links (capacities in bytes/s, one direction):

* ``("nvout", g)``, ``("nvin", g)``: device g's NVLink port (through NVSwitch every device has its
  own full bandwidth), used inside a node.
* ``("nicout", n)``, ``("nicin", n)``: node n's network interface, all its NICs together, used
  between nodes. Every device of the node shares it, so DP, TP and PP traffic contend there.
* ``("local", n)``: CPU ranks of node n exchange data through loopback/shared memory; one shared
  resource per node.
* ``("pcieout", g)``, ``("pciein", g)``: device g's PCIe link to the host, device→host and
  host→device (vPipe's swap). PCIe is full duplex and a GPU copies each way on its own copy
  engine, so a copy out and a copy back run side by side at the link's per-direction bandwidth
  (the catalog's ``pcie_bandwidth_GBps``).

The engine simulates one representative pipeline (data-parallel rank 0, tensor-parallel rank 0);
the other replicas do the same thing at the same time. Their traffic that shares a representative
node's NIC is counted by a multiplicity on that link: k identical flows get k shares of the
max-min fair allocation. Links private to one device (NVLink ports) need no multiplicity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mindpipe.simulator.collectives import link_type_capacities, wire_factor
from mindpipe.traces.catalog import DeviceSpec
from mindpipe.traces.config import Cluster, Plan

AXES = ("tp", "dp", "pp")


@dataclass(frozen=True, slots=True)
class FlowSpec:
    """Bytes that cross a set of links, ``multiplicity[link]`` identical flows on each."""

    links: tuple[tuple[str, int], ...]
    nbytes: float
    multiplicity: tuple[int, ...]
    link_type: str


@dataclass(frozen=True, slots=True)
class Phase:
    """One step of a collective: a fixed latency, then flows that all must finish.

    ``msg_bytes`` is the message size of one collective (what NCCL's efficiency depends on);
    ``count`` collectives of that size are merged into this phase (their latencies add up).
    """

    op: str
    group_size: int
    link_type: str
    flows: tuple[FlowSpec, ...]
    msg_bytes: float = 0.0
    count: int = 1


@dataclass
class Topology:
    """Placement of a plan on a cluster, link capacities and transfer decomposition."""

    plan: Plan
    cluster: Cluster
    device: DeviceSpec
    rank_order: str = "tp-dp-pp"
    capacity: dict[tuple[str, int], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        axes = tuple(self.rank_order.split("-"))
        if sorted(axes) != sorted(AXES):
            raise ValueError(f"rank_order {self.rank_order!r} must order tp, dp and pp, e.g. tp-dp-pp")
        sizes = {"tp": self.plan.tp, "dp": self.plan.grad_replicas, "pp": self.plan.pp}
        stride = 1
        self._stride: dict[str, int] = {}
        for ax in axes:
            self._stride[ax] = stride
            stride *= sizes[ax]
        self.is_cpu = self.device.kind == "cpu"
        caps = link_type_capacities(self.cluster, self.device)
        self.nvlink_Bps, self.nic_Bps, self.local_Bps, self.pcie_Bps = (
            caps["nvlink"], caps["nic"], caps["local"], caps["pcie"])
        # Memos of the pure decompositions below: build_work asks for the same collective once per
        # gradient bucket and per layer, and each answer walks the stage's dp × tp members.
        self._members_memo: dict[int, list[tuple[int, int, int]]] = {}
        self._collective_memo: dict[tuple[str, float, str, int, int], list[Phase]] = {}
        self._p2p_memo: dict[tuple[int, int, float], list[Phase]] = {}

    # -- placement -----------------------------------------------------------------------------
    def global_rank(self, pp: int, dp: int = 0, tp: int = 0) -> int:
        """Global rank of the device at mesh coordinates (pp, dp, tp)."""
        return pp * self._stride["pp"] + dp * self._stride["dp"] + tp * self._stride["tp"]

    def coords(self, g: int) -> tuple[int, int, int]:
        """Mesh coordinates (pp, dp, tp) of global rank ``g``: the inverse of :meth:`global_rank`."""
        return (g // self._stride["pp"] % self.plan.pp, g // self._stride["dp"] % self.plan.grad_replicas,
                g // self._stride["tp"] % self.plan.tp)

    def node(self, g: int) -> int:
        """Node of global rank ``g``."""
        return g // self.cluster.gpus_per_node

    def rep(self, pp_rank: int) -> int:
        """The representative device of pipeline rank ``pp_rank`` (dp 0, tp 0)."""
        return self.global_rank(pp_rank)

    def replicas_on_node(self, pp_rank: int) -> int:
        """Devices of pipeline rank ``pp_rank`` (all its dp × tp replicas) on the representative's node.

        They compute at the same time as the representative; on CPU ranks that share a node's
        cores they take that many shares of them.
        """
        n0 = self.node(self.rep(pp_rank))
        return sum(1 for _, _, g in self._members(pp_rank) if self.node(g) == n0)

    def _members(self, pp_rank: int) -> list[tuple[int, int, int]]:
        members = self._members_memo.get(pp_rank)
        if members is None:
            base, sd, st = self.global_rank(pp_rank), self._stride["dp"], self._stride["tp"]
            members = self._members_memo[pp_rank] = [
                (d, t, base + d * sd + t * st) for d in range(self.plan.grad_replicas) for t in range(self.plan.tp)]
        return members

    # -- link capacities ----------------------------------------------------------------------
    def link_capacity(self, link: tuple[str, int]) -> float:
        """Bytes/s of a link (cached)."""
        cap = self.capacity.get(link)
        if cap is None:
            kind = link[0]
            cap = {"nvout": self.nvlink_Bps, "nvin": self.nvlink_Bps, "nicout": self.nic_Bps, "nicin": self.nic_Bps,
                   "local": self.local_Bps, "pcieout": self.pcie_Bps, "pciein": self.pcie_Bps}[kind]
            if cap <= 0:
                raise ValueError(f"link {kind} has no bandwidth for device {self.device.name}")
            self.capacity[link] = cap
        return cap

    def _intra(self, src: int, dst: int, nbytes: float) -> FlowSpec:
        if self.is_cpu:
            return FlowSpec((("local", self.node(src)),), nbytes, (1,), "local")
        return FlowSpec((("nvout", src), ("nvin", dst)), nbytes, (1, 1), "nvlink")

    # -- transfers ----------------------------------------------------------------------------
    def p2p(self, src_pp: int, dst_pp: int, nbytes: float) -> list[Phase]:
        """Pipeline send of ``nbytes`` per device from stage-rank ``src_pp`` to ``dst_pp``."""
        key = (src_pp, dst_pp, nbytes)
        phases = self._p2p_memo.get(key)
        if phases is None:
            phases = self._p2p_memo[key] = self._p2p(src_pp, dst_pp, nbytes)
        return list(phases)

    def _p2p(self, src_pp: int, dst_pp: int, nbytes: float) -> list[Phase]:
        src, dst = self.rep(src_pp), self.rep(dst_pp)
        ns, nd = self.node(src), self.node(dst)
        if ns == nd:
            flow = self._intra(src, dst, nbytes)
            return [Phase("p2p", 2, flow.link_type, (flow,), nbytes)]
        # Replica (d, t) sends from global rank a to a + shift; count those leaving ns and entering nd.
        shift, per_node = self.global_rank(dst_pp) - src, self.cluster.gpus_per_node
        out_mult = in_mult = 0
        for _, _, a in self._members(src_pp):
            na, nb = a // per_node, (a + shift) // per_node
            out_mult += na == ns and nb != ns
            in_mult += nb == nd and na != nd
        flow = FlowSpec((("nicout", ns), ("nicin", nd)), nbytes, (max(out_mult, 1), max(in_mult, 1)), "nic")
        return [Phase("p2p", 2, "nic", (flow,), nbytes)]

    def collective(self, op: str, nbytes: float, axis: str, pp_rank: int, count: int = 1) -> list[Phase]:
        """Phases of a ring collective over the ``axis`` ("dp", "tp" or "cp") group of the representative.

        ``count`` back-to-back collectives of ``nbytes`` each are merged into one set of phases
        (the bytes add up, and so do the latencies).

        Inside one node: one ring over NVLink (or the loopback). Across nodes with g members per
        node: hierarchical — intra-node reduce-scatter, inter-node ring over the NICs on n/g per
        device, intra-node all-gather (BACKGROUND.md §3; NCCL's own choice differs in details).
        """
        key = (op, nbytes, axis, pp_rank, count)
        phases = self._collective_memo.get(key)
        if phases is None:
            phases = self._collective_memo[key] = self._collective(op, nbytes, axis, pp_rank, count)
        return list(phases)

    def _collective(self, op: str, nbytes: float, axis: str, pp_rank: int, count: int) -> list[Phase]:
        size = {"dp": self.plan.grad_replicas, "cp": self.plan.cp, "tp": self.plan.tp}[axis]
        if size == 1 or nbytes <= 0:
            return []
        members = [self.global_rank(pp_rank, 0, t) for t in range(size)] if axis == "tp" else [
            self.global_rank(pp_rank, d, 0) for d in range(size)]
        rep = members[0]
        n0 = self.node(rep)
        nodes = sorted({self.node(g) for g in members})
        g_local = sum(1 for g in members if self.node(g) == n0)
        if len(nodes) == 1:
            nxt = members[1]
            flow = self._intra(rep, nxt, wire_factor(op, size) * nbytes * count)
            return [Phase(op, size, flow.link_type, (flow,), nbytes, count)]
        phases: list[Phase] = []
        n_nodes = len(nodes)
        # Identical groups of this stage sharing node n0's NIC at the same moment.
        stage_on_node = sum(1 for _, _, g in self._members(pp_rank) if self.node(g) == n0)
        mult = max(stage_on_node // g_local, 1)
        if g_local > 1 and op in ("allreduce", "reducescatter"):
            flow = self._intra(rep, members[1], wire_factor("reducescatter", g_local) * nbytes * count)
            phases.append(Phase("reducescatter", g_local, flow.link_type, (flow,), nbytes, count))
        inter = FlowSpec((("nicout", n0), ("nicin", n0)), wire_factor(op, n_nodes) * nbytes * count, (mult, mult), "nic")
        phases.append(Phase(op, n_nodes, "nic", (inter,), nbytes / g_local, count))
        if g_local > 1 and op in ("allreduce", "allgather"):
            flow = self._intra(rep, members[1], wire_factor("allgather", g_local) * nbytes * count)
            phases.append(Phase("allgather", g_local, flow.link_type, (flow,), nbytes, count))
        return phases

    def _share_Bps(self, phases: list[Phase]) -> float:
        """Per-flow bandwidth of the slowest link the phases cross (a link's capacity over its flows)."""
        return min((self.link_capacity(link) / mult for ph in phases for f in ph.flows
                    for link, mult in zip(f.links, f.multiplicity, strict=True)), default=0.0)

    def p2p_bandwidth_Bps(self, src_pp: int, dst_pp: int) -> float:
        """Bytes/s one device gets for a pipeline send from ``src_pp`` to ``dst_pp`` (all replicas sending)."""
        return self._share_Bps(self.p2p(src_pp, dst_pp, 1.0))

    def group_bandwidth_Bps(self, axis: str, pp_rank: int) -> float:
        """Bytes/s one device gets on the slowest link of its ``axis`` ring (0 for a group of one)."""
        return self._share_Bps(self.collective("allreduce", 1.0, axis, pp_rank))

    def swap(self, pp_rank: int, nbytes: float, direction: Literal["out", "in"] = "out") -> list[Phase]:
        """Copy of ``nbytes`` over the device's PCIe link (vPipe's swap): to the host (``out``) or back
        (``in``), each direction a link of its own (module docstring)."""
        link = ("pcie" + direction, self.rep(pp_rank))
        return [Phase("p2p", 1, "pcie", (FlowSpec((link,), nbytes, (1,), "pcie"),), nbytes)]


__all__ = ["FlowSpec", "Phase", "Topology"]
