"""The objective's, the sweep's, the store's and the supernet space's refusals name the caller's arguments.

Before, ``tune(..., objective="goodput")`` from a notebook said ``--critical-batch: goodput needs
--critical-batch B ...``, ``SweepConfig(budget=0)`` said ``--budget: --budget 0 must be >= 1`` and a
second ``tune()`` into the same ``out`` said ``pass --resume``: flags a Python caller never typed.
The rules are written once; :class:`mindpipe.tuner.keys.ArgNames` picks the words, and
``mindpipe tune`` keeps printing what it always printed.
"""

from __future__ import annotations

from typing import Any

import pytest
from mindpipe.traces.builtin import load_cluster, load_network, load_supernet
from mindpipe.traces.data import load_shipped_trace
from mindpipe.traces.errors import ContractError
from mindpipe.tuner.api import NoFeasiblePlan, build_space, tune
from mindpipe.tuner.keys import CLI_ARG_NAMES, PYTHON_ARG_NAMES, ArgNames, point_key
from mindpipe.tuner.objectives import Objective, critical_batch_for, parse_constraint
from mindpipe.tuner.records import EvaluationRecord, Status, Verdict
from mindpipe.tuner.subnet_space import check_supernet_fixes
from mindpipe.tuner.sweep import SweepConfig
from mindpipe.tuner.target import TrainingTarget

from mindpipe.cli import main as mindpipe_main

GPT, NET, CPU = "gpt-mini", "supernet-mini", "cpu:1x2"
CFG = SweepConfig(optimizer="random", budget=1, workers=1)
SHIFT: Any = object()  # Objective only asks whether a time-shift is given
TARGET = TrainingTarget(samples=4e6, noise_scale=48.0)

# (tune's keywords, the Python message, the message with the CLI's naming)
TUNE_CASES: list[tuple[dict[str, Any], str, str]] = [
    ({"objective": "goodput"},
     "objective.critical_batch: goodput needs objective.critical_batch=B (> 0), the gradient noise scale, or a "
     "calibration's measured one (critical_batch_for)",
     "--critical-batch: goodput needs --critical-batch B (> 0), the gradient noise scale, or a --calibration whose "
     "runs measured it"),
    ({"objective": "carbon_to_target"},
     "objective.target: carbon_to_target needs objective.target (a TrainingTarget: the samples to train and the "
     "noise scale)",
     "--target-samples: carbon_to_target needs --target-samples N (and the noise scale, --critical-batch B)"),
    ({"model": NET, "objective": Objective("goodput", critical_batch=32.0)},
     "objective.critical_batch: supernets: goodput counts subnets trained per hour, with no statistical "
     "efficiency; leave objective.critical_batch out",
     "--critical-batch: supernets: goodput counts subnets trained per hour, with no statistical efficiency; "
     "leave --critical-batch out"),
    ({"config": SweepConfig(optimizer="grid", budget=1, workers=1)},
     "config.budget: grid search would simulate up to {size} plans, more than config.budget=1: raise config.budget "
     "or narrow the space with fixes",
     "--budget: grid search would simulate up to {size} plans, more than --budget 1: raise --budget or narrow the "
     "space with --fix"),
    ({"trace": load_shipped_trace("gpt-mini.cpu"), "fixes": ["precision=bf16"]},
     "fixes: precision: the trace was profiled in fp32, so it prices only precision=fp32: profile again with "
     "ProfileOptions.dtype, or tune without trace",
     "--fix: precision: the trace was profiled in fp32, so it prices only precision=fp32: profile again with "
     "--dtype, or tune without --trace"),
    ({"model": NET, "fixes": ["global_batch_size=16"]},
     "fixes: global_batch_size: a supernet's global batch is the samples each subnet trains on (micro_batch_size × dp): "
     "give it with global_batch",
     "--fix: global_batch_size: a supernet's global batch is the samples each subnet trains on (micro_batch_size × dp): "
     "give it with --global-batch"),
]


def _refused(tmp_path: Any, **kwargs: Any) -> str:
    out = tmp_path / "t"
    with pytest.raises(ContractError) as e:
        tune(kwargs.pop("model", GPT), CPU, out=out, plots=False, config=kwargs.pop("config", CFG), **kwargs)
    assert not out.exists()  # refused before anything is written
    return str(e.value)


@pytest.mark.parametrize("kwargs, python, cli", TUNE_CASES,
                         ids=["goodput", "to-target", "supernet", "grid", "dtype", "supernet-batch"])
def test_tune_names_its_keywords_and_the_cli_its_flags(tmp_path, kwargs, python, cli):
    size = build_space(load_network(GPT), load_cluster(CPU), None, None, ("balanced",)).size
    got = _refused(tmp_path, **kwargs)
    assert got == python.format(size=size) and "--" not in got
    assert _refused(tmp_path, arg_names=CLI_ARG_NAMES, **kwargs) == cli.format(size=size)


# (Objective's keywords, the Python message, the CLI's)
OBJECTIVE_CASES: list[tuple[dict[str, Any], str, str]] = [
    ({"name": "throughput", "constraints": [parse_constraint("goodput>=1")]},
     "objective.constraints: a goodput constraint needs objective.critical_batch",
     "--constraint: a goodput constraint needs --critical-batch"),
    ({"name": "energy", "shift": SHIFT},
     'objective: objective.shift time-shifting needs objective="carbon", not energy',
     "--objective: --window/--carbon-csv time-shifting needs --objective carbon, not energy"),
    ({"name": "throughput", "target": TARGET},
     'objective.target: a training target needs objective="carbon_to_target", not throughput',
     "--target-samples: a training target needs --objective carbon_to_target, not throughput"),
    ({"name": "goodput", "critical_batch": -1.0},
     "objective.critical_batch: goodput needs objective.critical_batch=B (> 0), the gradient noise scale, or a "
     "calibration's measured one (critical_batch_for)",
     "--critical-batch: goodput needs --critical-batch B (> 0), the gradient noise scale, or a --calibration whose "
     "runs measured it"),
    ({"name": "energy", "supernet": True},
     "objective: energy is not available for supernets: the supernet simulator prices no energy; use throughput "
     "(subnets trained per hour)",
     "--objective: energy is not available for supernets: the supernet simulator prices no energy; use throughput "
     "(subnets trained per hour)"),
    ({"name": "throughput", "supernet": True, "shift": SHIFT},
     "objective.shift: time-shifting prices energy, which the supernet simulator does not",
     "--carbon-csv: time-shifting prices energy, which the supernet simulator does not"),
]


@pytest.mark.parametrize("kwargs, python, cli", OBJECTIVE_CASES,
                         ids=["goodput-constraint", "shift", "target", "critical", "supernet-energy", "supernet-shift"])
def test_an_objective_built_in_python_names_its_fields(kwargs, python, cli):
    with pytest.raises(ContractError) as e:
        Objective(**kwargs)
    assert str(e.value) == python
    with pytest.raises(ContractError) as e:
        Objective(**kwargs, arg_names=CLI_ARG_NAMES)
    assert str(e.value) == cli


@pytest.mark.parametrize("field, flag", [("budget", "--budget"), ("workers", "--workers"),
                                         ("batch_size", "--batch-size")])
def test_a_sweep_config_names_its_fields(field, flag):
    with pytest.raises(ContractError) as e:
        SweepConfig(**{field: 0})
    assert str(e.value) == f"config.{field}: config.{field}=0 must be >= 1"
    with pytest.raises(ContractError) as e:
        SweepConfig(**{field: 0}, arg_names=CLI_ARG_NAMES)
    assert str(e.value) == f"{flag}: {flag} 0 must be >= 1"


def test_a_second_sweep_into_out_is_told_the_keyword(tmp_path):
    tune(GPT, CPU, out=tmp_path / "t", plots=False, config=CFG)
    with pytest.raises(ContractError) as e:
        tune(GPT, CPU, out=tmp_path / "t", plots=False, config=CFG)
    assert str(e.value) == f"{tmp_path / 't'}: already holds a sweep: pass resume=True to continue it, or choose another out"
    with pytest.raises(ContractError) as e:
        tune(GPT, CPU, out=tmp_path / "t", plots=False, config=CFG, arg_names=CLI_ARG_NAMES)
    assert str(e.value) == f"{tmp_path / 't'}: already holds a sweep: pass --resume to continue it, or choose another --out"
    with pytest.raises(ContractError) as e:  # what differs, and what the caller changes to change it
        tune(GPT, CPU, out=tmp_path / "t", plots=False, config=CFG, resume=True, fixes=["tp=1"])
    assert "differs in fixes (fixes); cannot resume" in str(e.value) and "--" not in str(e.value)
    with pytest.raises(ContractError) as e:
        tune(GPT, CPU, out=tmp_path / "t", plots=False, config=CFG, resume=True, fixes=["tp=1"], arg_names=CLI_ARG_NAMES)
    assert "differs in fixes (--fix); cannot resume" in str(e.value)


def test_the_cli_prints_what_it_always_printed(tmp_path, capsys):
    argv = ["tune", "--model", GPT, "--cluster", CPU, "--out", str(tmp_path / "t"), "--budget", "1", "--workers", "1",
            "--optimizer", "random", "--no-plots", "--quiet"]
    assert mindpipe_main([*argv, "--objective", "goodput"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "mindpipe: error: --critical-batch: goodput needs --critical-batch B (> 0), the gradient noise scale, or a "
        "--calibration whose runs measured it"]
    assert mindpipe_main(argv) == 0
    capsys.readouterr()
    assert mindpipe_main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"mindpipe: error: {tmp_path / 't'}: already holds a sweep: pass --resume to continue it, or choose another --out"]


def test_the_helpers_name_the_arguments_as_they_are_told():
    net = load_supernet(NET)
    for names, said in ((PYTHON_ARG_NAMES, "fixes: global_batch_size: a supernet's global batch is the samples each "
                                           "subnet trains on (micro_batch_size × dp): give it with global_batch"),
                        (CLI_ARG_NAMES, "--fix: global_batch_size: a supernet's global batch is the samples each "
                                        "subnet trains on (micro_batch_size × dp): give it with --global-batch")):
        with pytest.raises(ContractError) as e:
            check_supernet_fixes(net, {"global_batch_size": 16}, (), ("balanced",), arg_names=names)
        assert str(e.value) == said
    with pytest.raises(ContractError) as e:
        parse_constraint("speed>=1", arg_names=PYTHON_ARG_NAMES)
    assert e.value.source == "objective.constraints"
    model = load_network(GPT)
    assert critical_batch_for(8.0, None, model, True).note == "--critical-batch (typed)"
    assert critical_batch_for(8.0, None, model, True, arg_names=PYTHON_ARG_NAMES).note == "objective.critical_batch (typed)"


def test_arg_names_words():
    py, cli = PYTHON_ARG_NAMES, CLI_ARG_NAMES
    assert py.given("--budget", 0) == "config.budget=0" and cli.given("--budget", 0) == "--budget 0"
    assert py.given("--critical-batch", "B", placeholder=True) == "objective.critical_batch=B"
    assert cli.given("--critical-batch", "B", placeholder=True) == "--critical-batch B"
    assert py.switched_on("--resume") == "resume=True" and cli.switched_on("--resume") == "--resume"
    flags = ("--carbon-csv", "--window", "--job-hours", "--iterations", "--interruptible")
    assert py.either(*flags) == "objective.shift"
    assert cli.either(*flags) == "--carbon-csv, --window, --job-hours, --iterations or --interruptible"
    assert py.either("--objective", "--constraint", "the critical batch") == (
        "objective, objective.constraints or the critical batch")
    assert ArgNames().python is False


def _always_fails(problem: Any, point: Any) -> EvaluationRecord:
    return EvaluationRecord(point_key(point), dict(point), Status.ERROR, message="bug")


def test_no_feasible_plan_counts_simulations_refusals_and_rule_breaks_apart(tmp_path):
    """Combinations the plan rules filtered were never evaluated, and plans the memory estimate refused
    were never simulated: the message says so instead of one count of "evaluated"."""
    with pytest.raises(NoFeasiblePlan) as e:
        tune(GPT, "cpu:1x4", out=tmp_path / "e", plots=False, evaluator=_always_fails, screen=None,
             config=SweepConfig(optimizer="random", budget=3, workers=1))
    msg = str(e.value)
    assert msg.startswith("tune: no feasible plan among the 3 evaluated: 3 simulations (error: 3); 39 combinations "
                          "of the search space broke a plan rule (not evaluated); see ")
    with pytest.raises(NoFeasiblePlan) as e:
        tune("gpt3-175b", "a100-sxm4-80gb:1x8", out=tmp_path / "m", plots=False, global_batch=64,
             fixes=["tp=8", "schedule=1f1b", "zero_stage=0,3"], config=SweepConfig(optimizer="random", budget=4, workers=1))
    msg = str(e.value)
    assert " refused before simulating (out_of_memory: " in msg and "simulations (" not in msg
    assert "broke a plan rule" not in msg  # this space has no combination a rule filtered


def test_sweep_result_tells_refused_from_simulated(tmp_path):
    out = tune("gpt-13b", "a100-sxm4-40gb:1x8", out=tmp_path / "t", plots=False,
               config=SweepConfig(optimizer="random", budget=4, workers=1))
    res = out.result
    refused = [r for r in res.records if not r.feasible and not r.simulated]
    assert sum(res.refused.values()) == len(refused) > 0
    assert res.refused[Verdict.OUT_OF_MEMORY] == len(refused)
    assert res.simulated_infeasible + res.refused == res.infeasible
    assert sum(res.simulated_infeasible.values()) == sum(1 for r in res.records if not r.feasible and r.simulated)


# -- the training target, the job length and tune_max_batch ------------------------------------------


@pytest.mark.parametrize("kwargs,python,cli", [
    ({"samples": -1.0, "noise_scale": 48.0}, "TrainingTarget.samples: -1.0 samples", "--target-samples: -1.0 samples"),
    ({"samples": 4e6, "noise_scale": 0.0}, "TrainingTarget.noise_scale: the noise scale 0.0",
     "--critical-batch: the noise scale 0.0"),
    ({"samples": 4e6, "noise_scale": 48.0, "reference_batch": -2.0}, "TrainingTarget.reference_batch: -2.0 must be",
     "--target-batch: -2.0 must be"),
])
def test_training_target_names_its_fields_or_the_flags(kwargs, python, cli):
    with pytest.raises(ContractError) as e:
        TrainingTarget(**kwargs)
    assert str(e.value).startswith(python) and "--" not in str(e.value)
    with pytest.raises(ContractError) as e:
        TrainingTarget(**kwargs, arg_names=CLI_ARG_NAMES)
    assert str(e.value).startswith(cli)


def test_job_length_names_its_fields_or_the_flags():
    from mindpipe.tuner.timeshift import JobLength

    with pytest.raises(ContractError, match=r"^JobLength.hours/JobLength.iterations: give exactly one of hours and "
                                            r"iterations \(the job's length\)$"):
        JobLength()
    with pytest.raises(ContractError, match=r"^JobLength.iterations: 0 must be in \[1, "):
        JobLength(iterations=0)
    with pytest.raises(ContractError, match=r"^--job-hours/--iterations: give exactly one of --job-hours H and "
                                            r"--iterations N"):
        JobLength(arg_names=CLI_ARG_NAMES)
    with pytest.raises(ContractError, match=r"^--job-hours: -1.0 must be in \(0, "):
        JobLength(hours=-1.0, arg_names=CLI_ARG_NAMES)


@pytest.mark.parametrize("fixes,python", [
    ({"micro_batch_size": 2}, "fixes: micro_batch_size: tune_max_batch searches the micro-batch "
     "size (global batch = dp x micro-batch size x num_microbatches); do not pin it"),
    ({"partition": [2, 2]}, "with partitioners (vpipe, dawnpiper"),
    ({"cp": 2}, "fixes: cp: tune_max_batch searches dp x tp x pp meshes (cp=1)"),
])
def test_tune_max_batch_names_its_keywords(tmp_path, fixes, python):
    from mindpipe.tuner.maxbatch import tune_max_batch

    with pytest.raises(ContractError) as e:
        tune_max_batch(GPT, "cpu:1x4", out=tmp_path / "m", partitioners=["balanced"], fixes=fixes)
    assert python in str(e.value) and "--" not in str(e.value)
    with pytest.raises(ContractError) as e:
        tune_max_batch(GPT, "cpu:1x4", out=tmp_path / "m", partitioners=["balanced"], fixes=fixes,
                       arg_names=CLI_ARG_NAMES)
    assert "--fix" in str(e.value) and "--objective max_batch" in str(e.value)
