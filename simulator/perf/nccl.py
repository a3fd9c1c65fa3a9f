"""NCCL collective model: latency and size-dependent bandwidth efficiency per link type.

For one collective over ``k`` ranks on a link of bandwidth ``B`` (bytes/s, one direction, per
rank), the uncontended time is ``latency + wire_bytes / (B · efficiency)`` where the engine
decides ``wire_bytes`` (ring all-reduce ``2(k−1)/k·n`` per rank, reduce-scatter and all-gather
``(k−1)/k·n``, p2p ``n``; nccl-tests ``doc/PERFORMANCE.md``). Here:

* ``latency = base + step · steps(op, k)`` with ring steps ``2(k−1)`` (all-reduce), ``k−1``
  (reduce-scatter, all-gather, broadcast), 1 (p2p) — NCCL's own tuning model has the same form
  (``src/graph/tuning.cc``: ``baseLat + nsteps · hwLat``);
* ``efficiency = e_max(k) / (1 + (n_half / n)^γ)`` with ``e_max(k) = e_inf · (1 − c/k)``: a
  saturating curve in the message size ``n`` (small messages use fewer channels and the LL/LL128
  protocols), approaching a ceiling that grows with ``k`` (busbw normalises by ``2(k−1)/k``; the
  fixed per-rank cost of a ring step is spread over more ranks).

The NVLink constants are fitted to the A100 all-reduce LUTs (vTrain's ``AR_GPU{2,4,8}``) by
:mod:`mindpipe.simulator.perf.fit`; NIC, PCIe and tree constants are priors (no such data in shared/data).

Tree vs ring (BACKGROUND.md §3): NCCL's double binary tree all-reduce needs ``2·⌈log2 k⌉`` steps
instead of ``2(k−1)`` but reaches a lower bandwidth; NCCL's tuner takes whichever is faster for
the size. That is modelled for all-reduce across nodes (``nic``) from ``tree_min_ranks`` ranks:
``latency_s`` returns the smaller of the two latencies and ``efficiency`` is set so that
``latency_s + wire/(B·efficiency)`` equals the faster algorithm's time at the nominal bandwidth
``B`` of the link type (``link_bandwidth_Bps``). Intra-node NVLink all-reduce stays ring (NCCL
on NVSwitch A100), which is all the LUTs can show: they are single-node, k ≤ 8 and ≥ 1 MiB, so
they cannot confirm the tree crossover; the tree constants are NCCL's tuning priors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mindpipe.simulator.collectives import LINKS, OPS, ring_steps, wire_bytes
from mindpipe.simulator.perf.constants import ConstantsFile, shipped_constants
from mindpipe.traces.errors import ContractError

LINK_KEYS = ("base_latency_s", "step_latency_s", "efficiency_max", "efficiency_group_penalty", "half_size_bytes",
             "shape_exponent")
TREE_KEYS = ("tree.step_latency_s", "tree.bandwidth_factor", "tree.min_ranks")


@dataclass(frozen=True)
class LinkCurve:
    """Latency and efficiency constants of one link type (see module docstring)."""

    base_latency_s: float
    step_latency_s: float
    efficiency_max: float
    efficiency_group_penalty: float
    half_size_bytes: float
    shape_exponent: float

    def latency_s(self, op: str, k: int) -> float:
        """Ring latency of ``op`` over ``k`` ranks."""
        return self.base_latency_s + self.step_latency_s * ring_steps(op, k)

    def efficiency(self, op: str, nbytes: float, k: int) -> float:
        """Achieved fraction of the link bandwidth for an ``nbytes`` message (ring)."""
        kk = 2 if op == "p2p" else max(k, 2)
        top = self.efficiency_max * (1.0 - self.efficiency_group_penalty / kk)
        if nbytes <= 0:
            return top
        return top / (1.0 + (self.half_size_bytes / nbytes) ** self.shape_exponent)


@dataclass
class NcclCommModel:
    """Implements :class:`mindpipe.simulator.costs.CommModel` with NCCL curves per link type.

    Attributes:
        constants: Parsed NCCL constants; default: the shipped A100 fit.
        link_bandwidth_Bps: Nominal per-rank bandwidth of each link type, used only to choose
            between ring and tree all-reduce across nodes (see module docstring). Missing link
            types never use the tree.
    """

    constants: ConstantsFile | None = None
    link_bandwidth_Bps: dict[str, float] = field(default_factory=dict)
    curves: dict[str, LinkCurve] = field(default_factory=dict, init=False)
    tree_step_latency_s: float = field(default=0.0, init=False)
    tree_bandwidth_factor: float = field(default=1.0, init=False)
    tree_min_ranks: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        cf = self.constants or shipped_constants("nccl_a100.json")
        self.constants = cf
        for link in LINKS:
            vals = [cf.number(f"{link}.{k}") for k in LINK_KEYS]
            curve = LinkCurve(*vals)
            if not 0 < curve.efficiency_max <= 1.0 or not 0 <= curve.efficiency_group_penalty < 2:
                raise ContractError(cf.source, f"constants.{link}.efficiency_max", "efficiency must be in (0, 1]")
            self.curves[link] = curve
        self.tree_step_latency_s = cf.number("tree.step_latency_s")
        self.tree_bandwidth_factor = cf.number("tree.bandwidth_factor")
        self.tree_min_ranks = int(cf.number("tree.min_ranks"))

    def _curve(self, link: str) -> LinkCurve:
        curve = self.curves.get(link)
        if curve is None:
            raise ContractError("comm model", "link", f"unknown link type {link!r}; known: {', '.join(LINKS)}")
        return curve

    def _tree_ok(self, op: str, k: int, link: str) -> bool:
        return op == "allreduce" and link == "nic" and self.tree_min_ranks > 0 and k >= self.tree_min_ranks

    def _tree_latency_s(self, k: int, link: str) -> float:
        return self._curve(link).base_latency_s + self.tree_step_latency_s * 2 * math.ceil(math.log2(k))

    def latency_s(self, op: str, group_size: int, link: str) -> float:
        """Fixed time of one ``op``: the ring's, or the tree's when it is the faster choice at all."""
        ring = self._curve(link).latency_s(op, group_size)
        if self._tree_ok(op, group_size, link):
            return min(ring, self._tree_latency_s(group_size, link))
        return ring

    def algorithm(self, op: str, nbytes: float, group_size: int, link: str, link_bandwidth_Bps: float | None = None) -> str:
        """``"ring"`` or ``"tree"``: what NCCL's tuner would pick (faster uncontended time)."""
        bw = link_bandwidth_Bps or self.link_bandwidth_Bps.get(link)
        if not self._tree_ok(op, group_size, link) or not bw:
            return "ring"
        return "tree" if self._tree_time_s(nbytes, group_size, link, bw) < self._ring_time_s(op, nbytes, group_size, link, bw) else "ring"

    def _ring_time_s(self, op: str, nbytes: float, k: int, link: str, bw: float) -> float:
        c = self._curve(link)
        return c.latency_s(op, k) + wire_bytes(op, nbytes, k) / (bw * c.efficiency(op, nbytes, k))

    def _tree_time_s(self, nbytes: float, k: int, link: str, bw: float) -> float:
        eff = self._curve(link).efficiency("allreduce", nbytes, k) * self.tree_bandwidth_factor
        return self._tree_latency_s(k, link) + wire_bytes("allreduce", nbytes, k) / (bw * eff)

    def efficiency(self, op: str, nbytes: int, group_size: int, link: str) -> float:
        """Achieved fraction of the link bandwidth (see class and module docstrings)."""
        c = self._curve(link)
        eff = c.efficiency(op, nbytes, group_size)
        bw = self.link_bandwidth_Bps.get(link)
        if not self._tree_ok(op, group_size, link) or not bw or nbytes <= 0:
            return eff
        best = min(self._ring_time_s(op, nbytes, group_size, link, bw), self._tree_time_s(nbytes, group_size, link, bw))
        transfer = best - self.latency_s(op, group_size, link)
        return min(1.0, wire_bytes(op, nbytes, group_size) / (bw * transfer)) if transfer > 0 else eff

    def time_s(self, op: str, nbytes: float, group_size: int, link: str, link_bandwidth_Bps: float) -> float:
        """Uncontended time of one collective (see :func:`collective_time_s`)."""
        if op not in OPS:
            raise ContractError("comm model", "op", f"unknown collective {op!r}; known: {', '.join(OPS)}")
        if group_size < 1 or (group_size == 1 and op != "p2p") or nbytes <= 0:
            return 0.0
        if link_bandwidth_Bps <= 0:
            raise ContractError("comm model", "link_bandwidth_Bps", f"must be > 0, got {link_bandwidth_Bps}")
        ring = self._ring_time_s(op, nbytes, group_size, link, link_bandwidth_Bps)
        if self._tree_ok(op, group_size, link):
            return min(ring, self._tree_time_s(nbytes, group_size, link, link_bandwidth_Bps))
        return ring


def collective_time_s(op: str, nbytes: float, group_size: int, link: str, link_bandwidth_Bps: float,
                      model: NcclCommModel | None = None) -> float:
    """Uncontended end-to-end time of one collective of an ``nbytes`` buffer.

    Args:
        op: ``allreduce``, ``reducescatter``, ``allgather``, ``p2p`` or ``broadcast``.
        nbytes: Buffer size per rank (the full buffer; for p2p the message).
        group_size: Ranks k.
        link: ``nvlink``, ``nic``, ``pcie`` or ``local``.
        link_bandwidth_Bps: Per-rank one-direction bandwidth of that link (bytes/s).
        model: The comm model (default: shipped A100 NCCL constants).

    Returns:
        Seconds: latency + ring wire bytes / (bandwidth × efficiency), or the tree's time when
        NCCL would pick it.
    """
    return (model or NcclCommModel()).time_s(op, nbytes, group_size, link, link_bandwidth_Bps)


__all__ = ["LINK_KEYS", "TREE_KEYS", "LinkCurve", "NcclCommModel", "collective_time_s"]
