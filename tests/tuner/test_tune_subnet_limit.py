"""``tune --subnets N`` past the simulator's ``subnet_choices`` limit is refused up front, in one line.

Before, every point of the sweep was recorded as ``invalid`` with the reason in ``evaluations.csv``
and the run ended in "no feasible plan (invalid: 9)".
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest
from mindpipe.simulator.subnet_sim import SupernetSimulator
from mindpipe.traces.builtin import load_cluster, load_supernet
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import limit
from mindpipe.traces.schema import from_dict, to_dict
from mindpipe.traces.supernet import Supernet, check_subnet_count, max_subnets
from mindpipe.tuner.api import DEFAULT_SUBNETS, NoFeasiblePlan, tune
from mindpipe.tuner.keys import point_key
from mindpipe.tuner.records import EvaluationRecord
from mindpipe.tuner.sweep import SweepConfig

NET = "supernet-mini"  # 8 choice layers: at most 524,288 // 8 = 65,536 subnets
CLUSTER = "cpu:1x4"
TOO_MANY = ("subnets=65537 exceeds the limit of 65,536 subnets for supernet-mini: one simulation draws at most "
            "524,288 choices (subnets × num_layers, here 65537 × 8)")
"""The refusal, naming the argument as the Python API does (the CLI says ``--subnets=65537``)."""


def _deep(num_layers: int) -> Supernet:
    net = load_supernet(NET)
    return from_dict(Supernet, {**to_dict(net), "num_layers": num_layers, "name": f"deep{num_layers}"})


@pytest.mark.parametrize("name,most", [("supernet-mini", 65_536), ("naspipe-c1", 10_922), ("naspipe-c3", 10_922)])
def test_max_subnets_is_the_choices_limit_over_the_layers(name, most):
    net = load_supernet(name)
    assert limit("subnet_choices") == 524_288
    assert max_subnets(net) == most == 524_288 // net.num_layers
    check_subnet_count(net, most)  # the limit itself is accepted
    with pytest.raises(ContractError, match=f"exceeds the limit of {most:,} subnets for {name}"):
        check_subnet_count(net, most + 1)


def test_the_limit_is_the_simulators_own():
    """One rule: the count the tuner refuses is the first one the simulator refuses."""
    net = load_supernet(NET)
    sim = SupernetSimulator(net, load_cluster("cpu:1x2"))
    plan = Plan(pp=2, micro_batch_size=4, global_batch_size=4, subnet_schedule="csp")
    with pytest.raises(ContractError, match=re.escape("subnets×num_layers=65537×8=524296 exceeds the limit of 524,288")):
        sim.run(plan, max_subnets(net) + 1)
    assert sim.run(plan, 16).num_subnets == 16


@pytest.mark.parametrize("value,needle", [(0, "subnets=0 must be > 0"), (-3, "subnets=-3 must be > 0"),
                                          (True, "subnets=True must be an integer"),
                                          (2.5, "subnets=2.5 must be an integer")])
def test_bad_counts_are_refused(tmp_path, value, needle):
    with pytest.raises(ContractError) as err:
        tune(NET, CLUSTER, out=tmp_path / "t", subnets=value, config=SweepConfig(budget=2, workers=1), plots=False)
    assert str(err.value) == needle
    assert not (tmp_path / "t").exists()


def test_api_refuses_too_many_subnets_before_the_sweep(tmp_path):
    asked: list[str] = []

    def never(problem: Any, point: Any) -> EvaluationRecord:
        asked.append(point_key(point))
        raise AssertionError("no plan is evaluated")

    with pytest.raises(ContractError) as err:
        tune(NET, CLUSTER, out=tmp_path / "t", subnets=65_537, config=SweepConfig(budget=4, workers=1), plots=False,
             evaluator=never)
    assert not isinstance(err.value, NoFeasiblePlan)
    assert str(err.value) == TOO_MANY and err.value.key == "subnets"
    assert asked == [] and not (tmp_path / "t").exists()


def test_api_accepts_the_limit_and_hands_it_to_every_evaluation(tmp_path):
    seen: list[int] = []

    def recording(problem: Any, point: Any) -> EvaluationRecord:
        seen.append(problem.num_subnets)
        rec = EvaluationRecord(key=point_key(point), point=dict(point))
        rec.failed(ContractError("", None, "not simulated in this test"))
        return rec

    with pytest.raises(NoFeasiblePlan):
        tune(NET, CLUSTER, out=tmp_path / "t", subnets=65_536, config=SweepConfig(budget=2, workers=1), plots=False,
             evaluator=recording)
    assert seen and set(seen) == {65_536}


def test_a_default_count_past_a_deep_supernets_limit_says_it_is_the_default(tmp_path):
    net = _deep(4096)  # at most 128 subnets, fewer than the tuner's default 256
    assert max_subnets(net) == 128 < DEFAULT_SUBNETS
    with pytest.raises(ContractError) as err:
        tune(net, CLUSTER, out=tmp_path / "t", config=SweepConfig(budget=2, workers=1), plots=False)
    assert str(err.value) == ("subnets=256 (the default) exceeds the limit of 128 subnets for deep4096: one simulation "
                              "draws at most 524,288 choices (subnets × num_layers, here 256 × 4096); give subnets of "
                              "at most 128")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mindpipe.cli", "tune", *args], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("quiet", [True, False])
def test_cli_refuses_too_many_subnets_in_one_line_exit_2(tmp_path, quiet):
    out = tmp_path / "t"
    res = _cli("--model", NET, "--cluster", CLUSTER, "--out", str(out), "--budget", "4", "--workers", "1",
               "--no-plots", "--subnets", "65537", *(["--quiet"] if quiet else []))
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stdout == ""
    assert res.stderr.strip().splitlines() == [f"mindpipe: error: --{TOO_MANY}"]
    assert "Traceback" not in res.stderr and not out.exists()


def test_cli_refuses_a_default_count_past_a_deep_supernets_limit(tmp_path):
    model = tmp_path / "deep.json"
    model.write_text(json.dumps(to_dict(_deep(4096))))
    res = _cli("--model", str(model), "--cluster", CLUSTER, "--out", str(tmp_path / "t"), "--budget", "2",
               "--workers", "1", "--no-plots", "--quiet")
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.strip().splitlines() == [
        "mindpipe: error: --subnets=256 (the default) exceeds the limit of 128 subnets for deep4096: one simulation "
        "draws at most 524,288 choices (subnets × num_layers, here 256 × 4096); give --subnets of at most 128"]
