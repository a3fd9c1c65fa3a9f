"""Placement of ranks on nodes and the links (and multiplicities) each transfer uses."""

from __future__ import annotations

import pytest
from mindpipe.simulator.topology import Topology
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Cluster, Plan


def _topo(dp: int, tp: int, pp: int, per_node: int = 8, order: str = "tp-dp-pp", **cluster) -> Topology:
    world = dp * tp * pp
    c = Cluster(gpu="a100-sxm4-80gb", num_nodes=max(world // per_node, 1), gpus_per_node=min(per_node, world), **cluster)
    plan = Plan(dp=dp, tp=tp, pp=pp, global_batch_size=dp * pp, rank_order=order)
    return Topology(plan, c, get_device(c.gpu), rank_order=order)


def test_megatron_order_keeps_tp_innermost() -> None:
    t = _topo(dp=2, tp=4, pp=2)
    assert [t.global_rank(0, 0, k) for k in range(4)] == [0, 1, 2, 3]
    assert t.global_rank(0, 1, 0) == 4
    assert t.global_rank(1, 0, 0) == 8
    assert t.node(t.rep(1)) == 1


def test_tp_group_inside_a_node_uses_nvlink_only() -> None:
    t = _topo(dp=2, tp=8, pp=2)
    phases = t.collective("allreduce", 1000.0, "tp", 0)
    assert len(phases) == 1 and phases[0].link_type == "nvlink"
    # Ring all-reduce: each rank sends 2(k−1)/k of the buffer.
    assert phases[0].flows[0].nbytes == pytest.approx(2 * 7 / 8 * 1000.0)


def test_dp_group_across_nodes_shares_the_nic_with_every_tp_peer() -> None:
    # tp8 fills a node, so each DP ring edge crosses nodes and 8 rings (one per TP rank) share the NIC.
    t = _topo(dp=4, tp=8, pp=1)
    phases = t.collective("allreduce", 800.0, "dp", 0)
    assert [p.link_type for p in phases] == ["nic"]
    flow = phases[0].flows[0]
    assert flow.links == (("nicout", 0), ("nicin", 0))
    assert flow.multiplicity == (8, 8)
    assert flow.nbytes == pytest.approx(2 * 3 / 4 * 800.0)


def test_hierarchical_allreduce_when_several_members_share_a_node() -> None:
    # tp1, dp16 on 2 nodes of 8: reduce-scatter in the node, ring between nodes, all-gather in the node.
    t = _topo(dp=16, tp=1, pp=1)
    phases = t.collective("allreduce", 1600.0, "dp", 0)
    assert [(p.op, p.link_type) for p in phases] == [("reducescatter", "nvlink"), ("allreduce", "nic"),
                                                     ("allgather", "nvlink")]
    inter = phases[1].flows[0]
    assert inter.multiplicity == (1, 1)
    assert inter.nbytes == pytest.approx(2 * 1 / 2 * 1600.0)


def test_pipeline_send_between_nodes_counts_replicas_on_the_nic() -> None:
    t = _topo(dp=1, tp=8, pp=2)
    (phase,) = t.p2p(0, 1, 100.0)
    flow = phase.flows[0]
    assert flow.links == (("nicout", 0), ("nicin", 1))
    assert flow.multiplicity == (8, 8)
    same_node = _topo(dp=1, tp=4, pp=2)
    (phase,) = same_node.p2p(0, 1, 100.0)
    assert phase.link_type == "nvlink"


def test_cluster_bandwidth_overrides_the_catalog() -> None:
    t = _topo(dp=2, tp=8, pp=1, inter_node_bandwidth_Gbps=800.0, intra_node_bandwidth_GBps=150.0)
    assert t.link_capacity(("nicout", 0)) == pytest.approx(100e9)
    assert t.link_capacity(("nvout", 0)) == pytest.approx(150e9)


def test_cpu_hosts_on_several_nodes_need_the_link_between_them_and_then_use_it() -> None:
    from mindpipe.simulator.api import simulate
    from mindpipe.traces.builtin import load_model
    from mindpipe.traces.errors import ContractError

    with pytest.raises(ContractError, match="num_nodes=2 needs inter_node_bandwidth_Gbps"):
        Cluster(gpu="cpu", num_nodes=2, gpus_per_node=1)
    model, plan = load_model("gpt-tiny-8k"), Plan(dp=2, micro_batch_size=2, global_batch_size=8)
    exposed = {}
    for gbps in (1.0, 100.0):
        res = simulate(model, Cluster(gpu="cpu", num_nodes=2, gpus_per_node=1, inter_node_bandwidth_Gbps=gbps), plan)
        assert res.extra.bytes_by_link_type.get("nic", 0.0) > 0  # the gradient all-reduce crosses the nodes
        exposed[gbps] = res.extra.exposed_dp_comm_s
    assert exposed[1.0] > 10 * exposed[100.0] > 0
