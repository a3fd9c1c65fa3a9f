"""NCCL all-reduce model: fit on A100 LUTs and hold-out error, by group size and message size.

Fits the NVLink curve of :mod:`mindpipe.simulator.perf.nccl` on vTrain's ``AR_GPU{2,8}`` LUTs and checks
it on ``AR_GPU4`` (the shipped constants), and on even rows vs odd rows; also prints the shipped
model's ring/tree choice across nodes (NIC constants are priors: no multi-node data). Writes
``benchmarks/results/perf_nccl_fit.json``.

    .venv/bin/python benchmarks/perf_nccl_fit.py [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mindpipe.simulator.perf import NcclCommModel, collective_time_s, default_models
from mindpipe.simulator.perf.fit import nccl_report, read_luts
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Cluster

BUCKETS = ((1, 8), (8, 64), (64, 512), (512, 1025))  # MiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "perf_nccl_fit.json"))
    args = ap.parse_args()
    dev = get_device("a100-sxm4-80gb")
    bw = dev.nvlink_bandwidth_unidirectional_GBps * 1e9
    report = nccl_report(args.data, bw)
    for name, split in report["splits"].items():
        print(f"{name}: fit MAPE {split['fit_mape_percent']:.2f}%, hold-out MAPE {split['holdout_mape_percent']:.2f}% "
              f"(< 64 MiB: {split['holdout_mape_below_64MiB_percent']:.2f}%); by k: "
              + ", ".join(f"k={k} {v:.2f}%" for k, v in split["mape_by_group_percent"].items()))
    model = NcclCommModel()  # the shipped constants = the GPU2+GPU8 fit
    luts = read_luts(args.data)
    table = []
    print("\nshipped model vs LUT, MAPE by size bucket (GPU4 is held out):")
    for k, lut in luts.items():
        row: dict[str, object] = {"k": k}
        for lo, hi in BUCKETS:
            errs = [abs(collective_time_s("allreduce", n, k, "nvlink", bw, model) - t) / t
                    for n, t in zip(lut.sizes, lut.times_s, strict=True) if lo * 2**20 <= n < hi * 2**20]
            row[f"{lo}-{hi}MiB"] = 100 * sum(errs) / len(errs)
        worst = max(zip(lut.sizes, lut.times_s, strict=True),
                    key=lambda nt: abs(collective_time_s("allreduce", nt[0], k, "nvlink", bw, model) - nt[1]) / nt[1])
        row["worst_size_MiB"] = worst[0] / 2**20
        row["worst_error_percent"] = 100 * (collective_time_s("allreduce", worst[0], k, "nvlink", bw, model) / worst[1] - 1)
        table.append(row)
        print(f"  k={k}: " + ", ".join(f"{key} {v:.2f}%" for key, v in row.items() if key.endswith("MiB") and key[0].isdigit())
              + f"; worst {row['worst_error_percent']:+.1f}% at {row['worst_size_MiB']:.0f} MiB")
    _, comm = default_models(dev, Cluster(gpu=dev.name, num_nodes=64, inter_node_bandwidth_Gbps=800))
    assert isinstance(comm, NcclCommModel)
    nic_bw = comm.link_bandwidth_Bps["nic"]
    choice: list[dict[str, Any]] = []
    print("\nall-reduce across nodes (NIC, per-GPU share of 800 Gbit/s): NCCL-style ring/tree choice (priors)")
    for nodes in (2, 8, 32, 64):
        for n in (2**16, 2**20, 2**24, 2**28):
            algo = comm.algorithm("allreduce", n, nodes, "nic")
            t = collective_time_s("allreduce", n, nodes, "nic", nic_bw, comm)
            choice.append({"nodes": nodes, "bytes": n, "algorithm": algo, "time_s": t})
        print(f"  {nodes:3d} nodes: " + ", ".join(f"{c['bytes'] // 2**10} KiB {c['algorithm']} {c['time_s'] * 1e6:.0f} us"
                                                for c in choice[-4:]))
    result = {"device": dev.name, "nvlink_bandwidth_Bps": bw, "fit": report, "shipped_model_by_bucket": table,
              "nic_algorithm_choice": choice}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
