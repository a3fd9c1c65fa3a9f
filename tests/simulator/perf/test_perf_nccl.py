"""NCCL model: fit and hold-out error on the real A100 LUTs, latency steps, tree/ring choice, protocol."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from mindpipe.simulator.collectives import ring_steps, wire_bytes
from mindpipe.simulator.perf import NcclCommModel, collective_time_s, default_models
from mindpipe.simulator.perf.constants import shipped_constants
from mindpipe.simulator.perf.fit import fit_nvlink, mape, nccl_report, read_lut, read_luts
from mindpipe.simulator.perf.nccl import LinkCurve
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Cluster
from mindpipe.traces.errors import ContractError

NV_BW = get_device("a100-sxm4-80gb").nvlink_bandwidth_unidirectional_GBps * 1e9


@pytest.fixture(scope="module")
def report(shared_data: Path) -> dict:
    return nccl_report(shared_data, NV_BW)


def test_fit_on_gpu2_gpu8_predicts_held_out_gpu4(report: dict) -> None:
    split = report["splits"]["fit GPU2+GPU8, hold out GPU4"]
    assert split["holdout_mape_percent"] < 3.0
    assert split["holdout_mape_below_64MiB_percent"] < 6.0
    assert split["fit_mape_percent"] < 2.0


def test_fit_on_even_rows_predicts_odd_rows(report: dict) -> None:
    split = report["splits"]["fit even rows, hold out odd rows"]
    assert split["holdout_mape_percent"] < 2.5


def test_shipped_constants_are_the_regenerated_fit(report: dict, shared_data: Path) -> None:
    fitted = report["splits"]["fit GPU2+GPU8, hold out GPU4"]
    recs = shipped_constants("nccl_a100.json").records
    model = NcclCommModel()
    refit = LinkCurve(**fitted["constants"])
    luts = read_luts(shared_data)
    # Same curve (compared by its predictions: parameters on a flat ridge may drift between
    # scipy versions without changing the fit) and the same recorded hold-out error.
    for k, lut in luts.items():
        for n in lut.sizes[::64]:
            a = collective_time_s("allreduce", n, k, "nvlink", NV_BW, model)
            ref = refit.latency_s("allreduce", k) + wire_bytes("allreduce", n, k) / (NV_BW * refit.efficiency("allreduce", n, k))
            assert math.isclose(a, ref, rel_tol=5e-3), (k, n)
    for key in fitted["constants"]:
        assert math.isclose(recs[f"nvlink.{key}"].holdout_mape_percent, fitted["holdout_mape_percent"], abs_tol=0.05)
    # The shipped model reproduces every LUT through the public function.
    for k, lut in luts.items():
        errs = [abs(collective_time_s("allreduce", n, k, "nvlink", NV_BW, model) - t) / t
                for n, t in zip(lut.sizes, lut.times_s, strict=True)]
        assert 100 * sum(errs) / len(errs) < 3.0, k


def test_a_flat_model_fits_worse_than_the_saturating_one(shared_data: Path) -> None:
    # The size-dependent efficiency earns its keep: a constant-efficiency α-β fit is much worse.
    luts = read_luts(shared_data)
    curve = fit_nvlink(luts, lambda k, i: k != 4, NV_BW)
    flat = LinkCurve(curve.base_latency_s, curve.step_latency_s, curve.efficiency_max, curve.efficiency_group_penalty,
                     1e-9, 1.0)
    assert mape(curve, luts, lambda k, i: k == 4, NV_BW) < 0.5 * mape(flat, luts, lambda k, i: k == 4, NV_BW)


def test_latency_steps_and_wire_bytes_follow_the_ring() -> None:
    c = NcclCommModel().curves["nvlink"]
    for k in (2, 4, 8):
        assert ring_steps("allreduce", k) == 2 * ring_steps("reducescatter", k) == 2 * ring_steps("allgather", k)
        assert math.isclose(c.latency_s("allreduce", k), c.base_latency_s + 2 * (k - 1) * c.step_latency_s)
        assert math.isclose(wire_bytes("allreduce", 1000, k), 2 * (k - 1) / k * 1000)
    assert ring_steps("p2p", 2) == 1 and wire_bytes("p2p", 1000, 2) == 1000


def test_efficiency_saturates_in_size_and_stays_in_bounds() -> None:
    m = NcclCommModel()
    for link in ("nvlink", "nic", "pcie"):
        effs = [m.efficiency("allreduce", 2**e, 8, link) for e in range(10, 32, 2)]
        assert all(0 < e <= 1 for e in effs)
        assert effs == sorted(effs)


def test_collective_time_is_latency_plus_wire_over_achieved_bandwidth() -> None:
    # What the engine computes from the CommModel protocol equals collective_time_s.
    m = NcclCommModel()
    for op in ("allreduce", "reducescatter", "allgather", "p2p"):
        k = 2 if op == "p2p" else 8
        n = 24 * 2**20
        engine = m.latency_s(op, k, "nvlink") + wire_bytes(op, n, k) / (NV_BW * m.efficiency(op, n, k, "nvlink"))
        assert math.isclose(engine, collective_time_s(op, n, k, "nvlink", NV_BW, m), rel_tol=1e-12)
    assert collective_time_s("allreduce", 2**20, 1, "nvlink", NV_BW) == 0.0


def test_tree_wins_small_messages_across_many_nodes_and_ring_large_ones() -> None:
    cluster = Cluster(gpu="a100-sxm4-80gb", num_nodes=64, inter_node_bandwidth_Gbps=800)
    _, m = default_models(get_device("a100-sxm4-80gb"), cluster)
    assert isinstance(m, NcclCommModel)
    bw = m.link_bandwidth_Bps["nic"]
    assert math.isclose(bw, 800e9 / 8 / 8)
    assert m.algorithm("allreduce", 64 * 2**10, 64, "nic") == "tree"
    assert m.algorithm("allreduce", 2**30, 64, "nic") == "ring"
    assert m.algorithm("allreduce", 64 * 2**10, 64, "nvlink") == "ring"  # intra-node stays ring
    for n in (2**16, 2**22, 2**30):
        ring = m._ring_time_s("allreduce", n, 64, "nic", bw)
        tree = m._tree_time_s(n, 64, "nic", bw)
        t = collective_time_s("allreduce", n, 64, "nic", bw, m)
        assert t == min(ring, tree)
        # The protocol (latency + wire / (bw · efficiency)) gives the chosen algorithm's time.
        engine = m.latency_s("allreduce", 64, "nic") + wire_bytes("allreduce", n, 64) / (bw * m.efficiency("allreduce", n, 64, "nic"))
        assert math.isclose(engine, t, rel_tol=1e-9)


def test_unknown_links_and_ops_and_bad_luts_are_errors(tmp_path: Path) -> None:
    m = NcclCommModel()
    with pytest.raises(ContractError, match="unknown link type 'infiniband'"):
        m.latency_s("allreduce", 4, "infiniband")
    with pytest.raises(ContractError, match="unknown collective 'alltoallv'"):
        collective_time_s("alltoallv", 10, 4, "nvlink", NV_BW, m)
    bad = tmp_path / "AR_GPU2_1M_1024M_LUT"
    bad.write_text("size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)\n1048576,1,float,10,1,x,1\n")
    with pytest.raises(ContractError, match="line 2"):
        read_lut(bad, 2)
