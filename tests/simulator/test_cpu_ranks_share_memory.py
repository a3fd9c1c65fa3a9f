"""CPU ranks on one host share its RAM: the simulator's memory answers are per rank, so a plan the tuner
sizes for a CPU cluster is one ``mindpipe run`` accepts (before, ``tune --objective max_batch`` on
``cpu:1x4`` sized every rank against the host's whole RAM and ``run`` then refused the plan)."""

from __future__ import annotations

import json

import pytest
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.builtin import load_cluster, load_model, load_plan
from mindpipe.traces.catalog import get_device
from mindpipe.traces.errors import ContractError
from mindpipe.tuner.maxbatch import tune_max_batch

from mindpipe.cli.run import memory_check

MODEL = load_model("gpt-mini")
HOST = get_device("cpu").memory_capacity_bytes


def test_a_cpu_node_divides_its_ram_among_its_ranks_and_gpus_do_not():
    sim = Simulator(MODEL, load_cluster("cpu:1x4"))
    assert sim.ranks_per_device == 4 and sim.device.memory_capacity_bytes == HOST // 4
    plan = load_plan('{"pp": 4, "global_batch_size": 4}')
    assert all(r.capacity_bytes == HOST // 4 for r in sim.memory(plan))
    gpu = Simulator(MODEL, load_cluster("a100-sxm4-80gb:1x4"))
    assert gpu.ranks_per_device == 1 and gpu.device.memory_capacity_bytes == get_device("a100-sxm4-80gb").memory_capacity_bytes


def test_refuse_unless_fits_counts_the_clusters_sharing_unless_told():
    sim = Simulator(MODEL, load_cluster("cpu:1x4"))
    big = load_plan('{"pp": 4, "micro_batch_size": 1300, "global_batch_size": 5200}')
    need = max(r.total_bytes for r in sim.memory(big))
    assert HOST / 4 < need < HOST  # fits a whole host, not a quarter of it
    with pytest.raises(ContractError, match="× 4 ranks sharing it"):
        sim.refuse_unless_fits(big)
    sim.refuse_unless_fits(big, ranks_per_device=1)  # e.g. --memory-budget-gib: each rank emulates its own device


def test_max_batch_on_a_cpu_cluster_returns_a_plan_run_accepts(tmp_path):
    summary = tune_max_batch(MODEL, "cpu:1x4", out=tmp_path, partitioners=["balanced"], fixes={"pp": 4})
    plan = summary.best_plan
    assert plan is not None and summary.best.peak_memory_gib is not None
    assert summary.best.peak_memory_gib * 4 <= HOST / 2**30
    memory_check(MODEL, plan, get_device("cpu"), 4)  # mindpipe run's check: 4 ranks on this host
    assert json.loads((tmp_path / "best_plan.json").read_text())["micro_batch_size"] == plan.micro_batch_size
