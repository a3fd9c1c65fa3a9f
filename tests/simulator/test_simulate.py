"""The ``simulate`` contract: link contention and ``comm_priority``, energy/carbon, timeline, CLI."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys

import pytest
from mindpipe.simulator.api import SimulationOptions, simulate
from mindpipe.simulator.energy import J_PER_KWH, annual_intensity, load_hourly_intensity, wait_power_w
from mindpipe.traces.builtin import load_model
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Cluster, Plan

RESULT_KEYS = ("iteration_time_s", "throughput_samples_per_s", "throughput_tokens_per_s", "tflops_per_gpu", "mfu",
               "bubble_fraction", "memory_by_stage_gib", "peak_memory_gib", "fits_in_memory", "energy_j",
               "carbon_gco2")


def _contended(priority: str) -> Plan:
    # tp8 fills each node, so dp2 and pp4 both cross nodes: the gradient reduce-scatter/all-reduce
    # of the data-parallel replicas and the pipeline p2p share every node's 100 Gb/s NIC while the
    # last micro-batches' backward runs (buckets overlap it, Megatron --overlap-grad-reduce).
    return Plan(dp=2, tp=8, pp=4, micro_batch_size=1, global_batch_size=16, schedule="1f1b", recompute="full",
                comm_priority=priority)


def test_pp_first_shortens_a_contended_iteration() -> None:
    model = load_model("gpt-1.3b")
    cluster = Cluster(gpu="a100-sxm4-80gb", num_nodes=8, gpus_per_node=8, inter_node_bandwidth_Gbps=100)
    fair = simulate(model, cluster, _contended("fair"))
    first = simulate(model, cluster, _contended("pp_first"))
    # Both move the same bytes over the NIC; only who waits differs.
    assert fair.extra.bytes_by_link_type == pytest.approx(first.extra.bytes_by_link_type)
    assert fair.extra.bytes_by_link_type["nic"] > 0
    assert first.iteration_time_s < 0.98 * fair.iteration_time_s  # measured: 4.7 % shorter
    # On an uncontended cluster (one node, NVLink for everything) the policy changes nothing.
    quiet = Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=8)
    plan = {"dp": 2, "tp": 1, "pp": 4, "micro_batch_size": 1, "global_batch_size": 16, "schedule": "1f1b"}
    a = simulate(model, quiet, Plan(**plan, comm_priority="fair")).iteration_time_s
    b = simulate(model, quiet, Plan(**plan, comm_priority="pp_first")).iteration_time_s
    assert a == pytest.approx(b, rel=1e-3)


def test_energy_and_carbon_follow_busy_and_blocked_power() -> None:
    model = load_model("gpt-1.3b")
    cluster = Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=8, pue=1.2, region="SG")
    plan = Plan(dp=2, tp=2, pp=2, micro_batch_size=1, global_batch_size=8, schedule="1f1b")
    r = simulate(model, cluster, plan)
    dev = get_device("a100-sxm4-80gb")
    t = r.iteration_time_s
    # Busy power is the frequency model's at each rank's clock and load (at most the board limit).
    busy = r.extra.rank_busy_power_w
    assert all(wait_power_w(dev) < p <= dev.max_power_W for p in busy)
    expected = sum(p * c + wait_power_w(dev) * (t - c) for p, c in zip(busy, r.extra.rank_compute_s, strict=True)) * 4
    assert r.extra.device_energy_j == pytest.approx(expected, rel=1e-9)
    assert r.energy_j == pytest.approx(1.2 * expected, rel=1e-9)
    g_per_kwh, _ = annual_intensity("SG")
    assert r.carbon_gco2 == pytest.approx(r.energy_j / J_PER_KWH * g_per_kwh, rel=1e-9)
    # A busy device never draws less than a waiting one, so energy lies between the two bounds.
    assert 8 * wait_power_w(dev) * t * 1.2 <= r.energy_j <= 8 * dev.max_power_W * t * 1.2


def test_hourly_grid_intensity_changes_carbon_not_energy(shared_data) -> None:
    series = load_hourly_intensity(shared_data / "carbon" / "US-CAL-CISO_2024_hourly.csv")
    noon, night = dt.datetime(2024, 6, 1, 20), dt.datetime(2024, 6, 1, 8)  # UTC: solar noon vs night in California
    model = load_model("gpt-1.3b")
    cluster = Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=8, region="US-CAL-CISO")
    plan = Plan(dp=8, micro_batch_size=1, global_batch_size=8)
    day = simulate(model, cluster, plan, SimulationOptions(hourly_intensity=(series, noon)))
    dark = simulate(model, cluster, plan, SimulationOptions(hourly_intensity=(series, night)))
    assert day.energy_j == pytest.approx(dark.energy_j)
    assert day.carbon_gco2 < dark.carbon_gco2  # solar hours in CAISO are cleaner


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mindpipe.cli", "simulate", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_json_is_exactly_one_object_with_the_contract_keys(tmp_path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"dp": 2, "tp": 2, "pp": 2, "micro_batch_size": 1, "global_batch_size": 16,
                                "schedule": "interleaved_1f1b", "virtual_stages": 2}))
    timeline, table = tmp_path / "tl.json", tmp_path / "table.csv"
    res = _cli("--model", "gpt-1.3b", "--cluster", "a100-sxm4-80gb:1x8", "--plan", str(plan), "--json",
               "--timeline", str(timeline), "--action-table", str(table))
    assert res.returncode == 0, res.stderr
    payload = json.loads(res.stdout)
    for key in RESULT_KEYS:
        assert key in payload, key
    assert len(payload["memory_by_stage_gib"]) == 2 and payload["fits_in_memory"] is True
    assert 0 < payload["mfu"] < 1 and 0 < payload["bubble_fraction"] < 1
    # Chrome trace: one process per pipeline rank, compute and communication on separate threads.
    events = json.loads(timeline.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert len(names) >= 2
    by_thread: dict[int, set[str]] = {}
    for e in spans:
        by_thread.setdefault(e["tid"], set()).add(e.get("cat", ""))
    assert len(by_thread) >= 2
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    # The action table is the schedule the simulator timed, readable back (and by torch, see test_action_table).
    from mindpipe.simulator.action_table import read_csv
    from mindpipe.simulator.schedules import build_schedule

    back = read_csv(table, "interleaved_1f1b", num_microbatches=8)
    assert back.orders == build_schedule("interleaved_1f1b", 2, 8, 2).orders


@pytest.mark.parametrize(("plan", "needle"), [
    ({"tp": 3, "dp": 1, "pp": 1}, "tp=3"),
    ({"dp": 2, "tp": 2, "pp": 1}, "8"),
    ({"dp": 1, "tp": 1, "pp": 8, "global_batch_size": 4, "schedule": "1f1b"}, "pp"),
    ({"dp": 0, "tp": 8, "pp": 1}, "dp=0"),
    ({"dp": 8, "schedule": "pipedream-2bw"}, "schedule"),
])
def test_bad_plans_are_one_line_errors_with_exit_2(plan: dict, needle: str) -> None:
    full = {"dp": 8, "tp": 1, "pp": 1, "micro_batch_size": 1, "global_batch_size": 64} | plan
    res = _cli("--model", "gpt-1.3b", "--cluster", "a100-sxm4-80gb:1x8", "--plan", json.dumps(full))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mindpipe: error:"), res.stderr
    assert needle in lines[0] and "Traceback" not in res.stderr
    assert res.stdout == ""


def test_a_trace_of_another_model_is_refused_from_python_too(tmp_path) -> None:
    # simulate() (and everything that builds a Simulator: tune_max_batch, the sweeps) refuses a trace
    # taken for another model, as the CLI does, instead of pricing gpt-13b with gpt-mini's layers.
    from mindpipe.traces.builtin import load_cluster
    from mindpipe.traces.data import load_shipped_trace
    from mindpipe.traces.errors import ContractError
    from mindpipe.tuner.maxbatch import tune_max_batch

    mini = load_shipped_trace("gpt-mini.cpu")
    plan = Plan(dp=8, tp=8, global_batch_size=128)
    with pytest.raises(ContractError, match=r"trace was taken for gpt-mini .*, not for gpt-13b"):
        simulate(load_model("gpt-13b"), load_cluster("a100-sxm4-80gb:8x8"), plan, SimulationOptions(trace=mini))
    with pytest.raises(ContractError, match="trace was taken for gpt-mini"):
        tune_max_batch("gpt-1.3b", "a100-sxm4-80gb:1x8", out=tmp_path / "mb", partitioners=["balanced"],
                       fixes=["dp=8", "tp=1", "pp=1"], trace=mini)
    own = simulate(load_model("gpt-mini"), load_cluster("cpu:1x2"), Plan(dp=2, global_batch_size=8),
                   SimulationOptions(trace=mini))
    assert own.iteration_time_s > 0


def test_simulate_takes_what_the_cli_takes_and_dicts(tmp_path) -> None:
    # From Python, names, files, JSON text and dicts work as they do on the command line; anything
    # else is a ContractError naming what a model/cluster/plan may be (was an AttributeError deep inside).
    from mindpipe.traces.builtin import load_cluster
    from mindpipe.traces.errors import ContractError

    by_object = simulate(load_model("gpt-13b"), load_cluster("a100-sxm4-80gb:8x8"), Plan(dp=8, tp=8, global_batch_size=128))
    plan_file = tmp_path / "plan.json"
    plan_file.write_text('{"dp": 8, "tp": 8, "global_batch_size": 128}')
    for args in (("gpt-13b", "a100-sxm4-80gb:8x8", {"dp": 8, "tp": 8, "global_batch_size": 128}),
                 (dict(load_model("gpt-13b").__dict__), "a100-sxm4-80gb:8x8", plan_file),
                 ("gpt-13b", {"gpu": "a100-sxm4-80gb", "num_nodes": 8, "gpus_per_node": 8}, str(plan_file))):
        assert simulate(*args).iteration_time_s == by_object.iteration_time_s
    with pytest.raises(ContractError, match="a model is a built-in name, a file, JSON text, a dict or a Model object, "
                                            "not NoneType"):
        simulate(None, "a100-sxm4-80gb:8x8", {})  # type: ignore[arg-type]
    with pytest.raises(ContractError, match=r"<plan dict>: dpp: unknown key"):
        simulate("gpt-13b", "a100-sxm4-80gb:8x8", {"dpp": 2})


def test_a_trace_with_another_number_of_blocks_is_said():
    """A trace's block records are used in order, cyclically: a 2-block trace priced for a 4-block
    model, or a 4-block one for 2, is said in the result's warning (it was silent)."""
    import dataclasses

    from mindpipe.simulator.simulator import Simulator
    from mindpipe.traces.config import Model
    from mindpipe.traces.trace import LayerRecord, Provenance, Trace

    def trace(blocks: int) -> Trace:
        layers = [LayerRecord("embedding", "embedding", 1e-3, 1e-3, 0.0)]
        layers += [LayerRecord(f"block.{i}", "block", 2e-3, 4e-3, 0.0) for i in range(blocks)]
        layers += [LayerRecord("lm_head", "lm_head", 1e-3, 2e-3, 0.0)]
        return Trace(device="cpu", dtype="fp32", layers=layers, provenance=Provenance(tool="test"), micro_batch_size=1)

    model = Model(kind="gpt", num_layers=4, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128)
    plan = Plan(micro_batch_size=1, global_batch_size=1, precision="fp32")
    cluster = Cluster(gpu="cpu", num_nodes=1, gpus_per_node=1)
    few = Simulator(model, cluster, trace=trace(2)).run(plan)
    assert few.extra.warning == "the trace has 2 block records for the model's 4 blocks: repeated in order"
    many = Simulator(dataclasses.replace(model, num_layers=2), cluster, trace=trace(4)).run(plan)
    assert many.extra.warning == "the trace has 4 block records for the model's 2 blocks: the first 2 used"
    assert Simulator(model, cluster, trace=trace(4)).run(plan).extra.warning is None
