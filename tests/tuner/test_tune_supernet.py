"""``mindpipe tune`` for supernets: the partition rule, the space, the sweep end to end, refusals."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pandas as pd
import pytest
from mindpipe.simulator.subnet_costs import PartCost, SupernetCosts
from mindpipe.simulator.subnet_sim import SupernetSimulator
from mindpipe.traces.builtin import load_cluster, load_model, load_plan, load_supernet
from mindpipe.traces.config import MadeFor, Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import from_dict, to_dict
from mindpipe.traces.supernet import check_supernet_plan
from mindpipe.tuner.api import build_space, tune
from mindpipe.tuner.keys import plan_of
from mindpipe.tuner.objectives import Objective
from mindpipe.tuner.partition import minmax_partition
from mindpipe.tuner.subnet_partition import (
    balanced_supernet_partition,
    expected_stage_loads,
    mean_layer_load,
    supernet_partition,
)
from mindpipe.tuner.sweep import SweepConfig

NET = "supernet-mini"
CLUSTER = "cpu:1x4"


def _costs(layers: int, cand: list[float], embedding: float, head: float) -> SupernetCosts:
    """Costs with forward = x/3 and backward = 2x/3 per part (so F + B = x)."""
    net = load_supernet(NET)
    net = from_dict(type(net), {**to_dict(net), "num_layers": layers, "candidates": to_dict(net.candidates)[:len(cand)]})

    def part(x: float) -> PartCost:
        return PartCost(forward_s=x / 3, backward_input_s=x / 3, backward_weight_s=x / 3)

    return SupernetCosts(net, tuple(part(x) for x in cand), part(embedding), part(head), "test")


# -- the partition rule ------------------------------------------------------------------------------


@pytest.mark.parametrize("layers,stages", [(8, 2), (8, 3), (8, 4), (48, 8), (7, 7)])
def test_equal_costs_without_shared_parts_split_evenly(layers, stages):
    part = balanced_supernet_partition(_costs(layers, [1.0, 1.0], 0.0, 0.0), stages)
    assert sum(part) == layers and max(part) - min(part) <= 1
    assert part == sorted(part)  # ties go to the later stages: early stages hold fewer


def test_expected_stage_time_is_the_mean_candidate_per_layer_plus_the_shared_parts():
    costs = _costs(8, [1.0, 3.0, 2.0], 0.5, 4.0)  # mean candidate 2
    assert mean_layer_load(costs) == pytest.approx(2.0)
    assert expected_stage_loads(costs, [3, 3, 2]) == pytest.approx([3 * 2 + 0.5, 3 * 2, 2 * 2 + 4.0])


@pytest.mark.parametrize("head_units,stages", [(2, 4), (3, 4), (5, 3), (12, 8), (0, 5)])
def test_heavy_head_closed_form_and_the_minmax_optimum(head_units, stages):
    layers = 48
    costs = _costs(layers, [1.0, 1.0], 0.0, float(head_units))
    part = balanced_supernet_partition(costs, stages)
    loads = expected_stage_loads(costs, part)
    # Equal unit layers: the bottleneck is the larger of ceil((L + head) / p) and 1 + head (the last stage's layer).
    assert max(loads) == pytest.approx(max(math.ceil((layers + head_units) / stages), 1 + head_units))
    # ... which is the GPT tuner's exact min-max over the same loads, and the rest is spread evenly.
    best = minmax_partition([1.0] * layers, stages, 0.0, float(head_units))
    assert max(loads) == pytest.approx(max(expected_stage_loads(costs, best)))
    others = loads[:-1]
    assert max(others) - min(others) <= 1 + 1e-9


def test_even_rule_and_too_many_stages():
    costs = _costs(8, [1.0], 0.0, 10.0)
    assert supernet_partition("even", costs, 3) == [3, 3, 2]
    with pytest.raises(ContractError, match="9 stages"):
        supernet_partition("balanced", costs, 9)
    with pytest.raises(ContractError, match="not a supernet partitioner"):
        supernet_partition("pipedream", costs, 2)


# -- the space ---------------------------------------------------------------------------------------


def test_space_points_are_supernet_plans_with_the_batch_per_subnet_fixed():
    net, cluster = load_supernet(NET), load_cluster(CLUSTER)
    space = build_space(net, cluster, None, None, ("balanced", "even"))
    assert space.size > 0
    for point in space.points:
        plan = plan_of(point)
        check_supernet_plan(plan, net, cluster)
        assert plan.tp == 1 and plan.global_batch_size == 16 == plan.micro_batch_size * plan.dp
        assert point["subnet_schedule"] in ("csp", "sequential")
        if point["subnet_schedule"] == "csp" and point["pp"] > 1:
            assert point["subnet_window"] in (point["pp"], 2 * point["pp"], 4 * point["pp"])
        else:
            assert point["subnet_window"] is None
    values = space.describe()["values"]
    assert values["pp"] == [1, 2, 4] and values["dp"] == [4, 2, 1]
    # One stage: CSP is sequential training and the partitioner has nothing to choose.
    assert [p["subnet_schedule"] for p in space.points if p["pp"] == 1] == ["csp"]


def test_sync_only_on_request():
    space = build_space(load_supernet(NET), load_cluster(CLUSTER), None, ["subnet_schedule=sync", "pp=2"], ("balanced",))
    assert {p["subnet_schedule"] for p in space.points} == {"sync"}
    assert sorted(p["subnet_window"] for p in space.points) == [2, 4, 8]


def test_pinned_micro_batch_frees_the_batch():
    space = build_space(load_supernet(NET), load_cluster(CLUSTER), None, ["micro_batch_size=2"], ("balanced",))
    assert {(p["dp"], p["global_batch_size"]) for p in space.points} == {(4, 8), (2, 4), (1, 2)}


@pytest.mark.parametrize("fixes,what_if,needle", [
    (["tp=2"], None, "tensor parallelism is not supported for supernets"),
    (["schedule=gpipe"], None, "subnet_schedule"),
    (["zero_stage=1"], None, "zero_stage"),
    (["recompute=full"], None, "not searched for supernets"),
    (["global_batch_size=16"], None, "give it with --global-batch"),
    (["dp=3"], None, None),
    ([], "all", "not modelled for supernets"),
])
def test_space_refusals(fixes, what_if, needle):
    if needle is None:  # allowed, but no point survives: tune() then says why (no feasible plan)
        space = build_space(load_supernet(NET), load_cluster(CLUSTER), None, fixes, ("balanced",), what_if)
        assert space.size == 0 and space.rejected_total > 0
        return
    with pytest.raises(ContractError, match=needle):
        build_space(load_supernet(NET), load_cluster(CLUSTER), None, fixes, ("balanced",), what_if)


def _gpt() -> Model:
    return load_model("gpt-mini")


def test_subnet_keys_refused_for_gpt():
    with pytest.raises(ContractError, match="applies to supernets only"):
        build_space(_gpt(), load_cluster(CLUSTER), None, ["subnet_schedule=csp"], ("balanced",))


@pytest.mark.parametrize("name", ["energy", "carbon"])
def test_energy_objectives_refused_for_supernets(name):
    with pytest.raises(ContractError, match="prices no energy"):
        Objective(name, supernet=True)


def test_supernet_objective_is_subnets_per_hour():
    obj = Objective("goodput", supernet=True)
    assert obj.metric == "subnets_per_hour" and obj.maximize and "subnets trained per hour" in obj.describe()


def test_made_for_names_exactly_one_network():
    cluster, net = load_cluster(CLUSTER), load_supernet(NET)
    made = MadeFor(None, cluster, supernet=net)
    assert from_dict(MadeFor, to_dict(made)) == made and made.describe().startswith("supernet-mini on")
    with pytest.raises(ContractError, match="exactly one"):
        MadeFor(None, cluster)
    with pytest.raises(ContractError, match="exactly one"):
        MadeFor(_gpt(), cluster, supernet=net)


# -- end to end --------------------------------------------------------------------------------------


def test_tune_supernet_end_to_end(tmp_path):
    out = tmp_path / "sweep"
    outcome = tune(NET, CLUSTER, out=out, partitioners=("balanced", "even"), subnets=64,
                   config=SweepConfig(optimizer="grid", budget=40, workers=1), plots=False)
    info = outcome.summary.to_dict()
    table = pd.read_csv(out / "evaluations.csv")
    feasible = table[table["feasible"]]
    assert len(feasible) == outcome.space.size  # grid: every point, all of them fit a CPU
    assert info["best_value"] == pytest.approx(feasible["subnets_per_hour"].max())
    assert (feasible["value"] == feasible["subnets_per_hour"]).all()
    assert info["supernet"]["goodput"] == "for supernets, goodput counts subnets trained per hour"
    assert info["supernet"]["best_plan_equivalent_to_sequential"] is True
    plan = load_plan(str(out / "best_plan.json"))
    net, cluster = load_supernet(NET), load_cluster(CLUSTER)
    check_supernet_plan(plan, net, cluster)
    assert plan.made_for is not None and plan.made_for.model is None and plan.made_for.supernet == net
    assert plan.partition is not None and sum(plan.partition) == net.num_layers
    # The value is the simulator's on the plan written (not a number of the tuner's own).
    again = SupernetSimulator(net, cluster).run(Plan(**{**to_dict(plan), "made_for": None}), 64)
    assert info["best_value"] == pytest.approx(again.subnets_per_hour, rel=1e-12)
    # CSP never loses to sequential on the same mesh and batch (it may run them in the same order).
    for pp in (2, 4):
        rows = feasible[feasible["pp"] == pp]
        assert rows[rows["subnet_schedule"] == "csp"]["value"].max() >= \
            rows[rows["subnet_schedule"] == "sequential"]["value"].max() * (1 - 1e-9)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mindpipe.cli", "tune", *args], capture_output=True, text=True,
                          timeout=600)


def test_cli_json_and_sync_label(tmp_path):
    res = run_cli("--model", NET, "--cluster", CLUSTER, "--out", str(tmp_path / "s"), "--budget", "3", "--workers",
                  "1", "--fix", "subnet_schedule=sync", "--fix", "pp=2", "--subnets", "64", "--no-plots", "--json",
                  "--objective", "goodput")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert {"best_value", "best_plan", "supernet", "objective"} <= set(info)
    assert info["best_plan"]["subnet_schedule"] == "sync" and info["best_plan"]["made_for"]["supernet"]["name"] == NET
    assert info["supernet"]["best_plan_equivalent_to_sequential"] is False
    assert info["objective"].startswith("maximise subnets per hour")
    table = pd.read_csv(tmp_path / "s" / "evaluations.csv")
    assert not table["equivalent_to_sequential"].any()
    text = run_cli("--model", NET, "--cluster", CLUSTER, "--out", str(tmp_path / "s"), "--budget", "3", "--workers",
                   "1", "--fix", "subnet_schedule=sync", "--fix", "pp=2", "--subnets", "64", "--no-plots", "--resume",
                   "--objective", "goodput")
    assert text.returncode == 0, text.stderr
    assert "NOT equivalent to sequential training" in text.stdout and "3 from a previous run" in text.stdout


@pytest.mark.parametrize("extra,needle", [
    (("--model", NET, "--fix", "tp=2"), "tp=2: tensor parallelism is not supported for supernets"),
    (("--model", NET, "--objective", "energy"), "prices no energy"),
    (("--model", NET, "--objective", "goodput", "--critical-batch", "64"), "leave --critical-batch out"),
    (("--model", NET, "--objective", "max_batch", "--subnets", "8"), "max_batch"),
    (("--model", NET, "--partitioner", "pipedream"), "not a supernet partitioner"),
    (("--model", "gpt-mini", "--subnets", "8"), "--subnets"),
    (("--model", "gpt-mini", "--fix", "subnet_window=4"), "applies to supernets only"),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, extra, needle):
    res = run_cli("--cluster", CLUSTER, "--out", str(tmp_path / "x"), "--budget", "2", "--workers", "1", "--quiet",
                  *extra)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and res.stdout == ""


def test_gpt_runner_refuses_a_tuned_supernet_plan_naming_the_supernet():
    from mindpipe.executor.config import resolve_model

    plan = Plan(pp=2, micro_batch_size=4, global_batch_size=4, subnet_schedule="csp",
                made_for=MadeFor(None, load_cluster("cpu:1x2"), supernet=load_supernet(NET)))
    with pytest.raises(ContractError, match="tuned for the supernet supernet-mini; run it with --model supernet-mini"):
        resolve_model(None, plan, "best_plan.json")
    with pytest.raises(ContractError, match="supernet-mini"):
        resolve_model("gpt-mini", plan, "best_plan.json")


def test_stage_clocks_are_refused_for_a_supernet_before_the_search(tmp_path):
    """The supernet simulator prices no energy: --clocks is refused in one line, before any simulation."""
    with pytest.raises(ContractError, match=r"^clocks: per-stage clocks are planned for GPT and Llama models"):
        tune(NET, CLUSTER, out=tmp_path / "t", clocks="perseus", config=SweepConfig(budget=2, workers=1), plots=False)
    assert not (tmp_path / "t" / "evaluations.csv").exists()


def test_cli_text_names_only_the_files_written_and_counts_feasible_plans_as_such(tmp_path):
    """No carbon front for a supernet: no pareto.csv or pareto.png, and the outputs line lists neither."""
    out = tmp_path / "s"
    res = run_cli("--model", NET, "--cluster", CLUSTER, "--out", str(out), "--budget", "3", "--workers", "1",
                  "--fix", "pp=2", "--subnets", "64", "--quiet")
    assert res.returncode == 0, res.stderr
    lines = {line[:16].strip(): line[17:] for line in res.stdout.splitlines()}
    assert lines["infeasible"] == "none of the 3 simulations"
    assert lines["refused"] == "none before simulating"
    listed = lines["outputs"].removeprefix(f"{out}/").split(", ")
    assert listed == ["best_plan.json", "best.json", "evaluations.csv/.parquet", "convergence.png", "summary.json"]
    assert not (out / "pareto.csv").exists() and not (out / "pareto.png").exists()
    for name in listed:
        assert all((out / f).exists() for f in name.replace("csv/.parquet", "csv,evaluations.parquet").split(","))
