"""``tune()``'s errors name the argument its caller used: the keyword from Python, the flag from the CLI.

Before, a notebook calling ``tune(..., fixes=["comm_priority=pp_first"])`` was told
``--fix: ... add --what-if comm_priority to search or pin it``, flags it never typed. The messages are
written once; the caller picks the naming (:class:`mindpipe.tuner.keys.ArgNames`).
"""

from __future__ import annotations

from typing import Any

import pytest
from mindpipe.traces.data import load_shipped_trace
from mindpipe.traces.errors import ContractError
from mindpipe.tuner.api import NoFeasiblePlan, tune
from mindpipe.tuner.keys import CLI_ARG_NAMES, PYTHON_ARG_NAMES, parse_fixes
from mindpipe.tuner.sweep import SweepConfig

from mindpipe.cli import main as mindpipe_main

GPT, NET, CPU = "gpt-mini", "supernet-mini", "cpu:1x2"
CFG = SweepConfig(optimizer="random", budget=2, workers=1)
# (tune's keywords, the flags mindpipe tune takes for the same input, the Python message, the CLI message)
CASES: list[tuple[dict[str, Any], list[str], str, str]] = [
    ({"fixes": ["comm_priority=pp_first"]}, ["--fix", "comm_priority=pp_first"],
     'fixes: comm_priority="pp_first" is a what-if knob (the executor runs only comm_priority="fair"): '
     'add what_if="comm_priority" to search or pin it',
     '--fix: comm_priority="pp_first" is a what-if knob (the executor runs only comm_priority="fair"): '
     'add --what-if comm_priority to search or pin it'),
    ({"fixes": {"tp": "two"}}, ["--fix", "tp=two"],
     "fixes: tp='two' must be an integer (at most 18 digits)",
     "--fix: tp='two' must be an integer (at most 18 digits)"),
    ({"fixes": ["partitioner=even"]}, ["--fix", "partitioner=even"],
     'fixes: partitioner: the partitioner is chosen with partitioners=["NAME"] (a list is searched as a '
     "dimension), not fixes",
     "--fix: partitioner: the partitioner is chosen with --partitioner NAME (a comma list is searched as a "
     "dimension), not --fix"),
    ({"fixes": ["partition=[0,2]"]}, ["--fix", "partition=[0,2]"],
     "fixes: partition[0]=0 must be > 0", "--fix: partition[0]=0 must be > 0"),
    ({"global_batch": "1:x"}, ["--global-batch", "1:x"],
     "global_batch: '1:x' is not N, A,B,C or A:B with 0 < A <= B <= 16,777,216 (the global_batch_size limit)",
     "--global-batch: '1:x' is not N, A,B,C or A:B with 0 < A <= B <= 16,777,216 (the global_batch_size limit)"),
    ({"what_if": "cp"}, ["--what-if", "cp"],
     'what_if: cp is not a what-if knob: mindpipe run carries it out; search it with search="cp"',
     "--what-if: cp is not a what-if knob: mindpipe run carries it out; search it with --search cp"),
    ({"search": "tp"}, ["--search", "tp"],
     "search: tp is searched by default (search takes: cp)",
     "--search: tp is searched by default (--search takes: cp)"),
    ({"partitioners": ["nope"]}, ["--partitioner", "nope"],
     "partitioners: 'nope' is not one of balanced, pipedream, even, vpipe, dawnpiper",
     "--partitioner: 'nope' is not one of balanced, pipedream, even, vpipe, dawnpiper"),
    ({"fixes": ["precision=fp8"]}, ["--fix", "precision=fp8"],
     "fixes: precision 'fp8' needs FP8 tensor cores (H100, H200); cpu has none (use bf16)",
     "--fix: precision 'fp8' needs FP8 tensor cores (H100, H200); cpu has none (use bf16)"),
    ({"clocks": "perseus"}, ["--clocks", "perseus"],
     "clocks: stage_clocks_mhz: no frequency data for 'cpu': clock plans need one of a100-sxm4-40gb, "
     "a100-sxm4-80gb, h100-sxm5-80gb, h200-sxm-141gb",
     "--clocks: stage_clocks_mhz: no frequency data for 'cpu': clock plans need one of a100-sxm4-40gb, "
     "a100-sxm4-80gb, h100-sxm5-80gb, h200-sxm-141gb"),
]


def _refused(tmp_path: Any, model: str = GPT, **kwargs: Any) -> ContractError:
    out = tmp_path / "t"
    with pytest.raises(ContractError) as e:
        tune(model, kwargs.pop("cluster", CPU), out=out, config=kwargs.pop("config", CFG), plots=False, **kwargs)
    assert not out.exists()  # refused before anything is written
    return e.value


@pytest.mark.parametrize("kwargs, _flags, python, _cli", CASES, ids=[c[1][0] + " " + c[1][1] for c in CASES])
def test_python_callers_are_told_the_keyword(tmp_path, kwargs, _flags, python, _cli):
    err = _refused(tmp_path, **kwargs)
    assert str(err) == python
    assert "--" not in str(err)  # no flag the caller never typed


@pytest.mark.parametrize("kwargs, _flags, _python, cli", CASES, ids=[c[1][0] + " " + c[1][1] for c in CASES])
def test_the_same_messages_name_the_flags_for_the_cli(tmp_path, kwargs, _flags, _python, cli):
    """One owner: the CLI's naming of the same call gives the messages mindpipe tune has always printed."""
    assert str(_refused(tmp_path, arg_names=CLI_ARG_NAMES, **kwargs)) == cli


@pytest.mark.parametrize("flags, cli", [(c[1], c[3]) for c in CASES[:3]], ids=["what-if pin", "fix value", "partitioner"])
def test_mindpipe_tune_prints_the_flags(tmp_path, capsys, flags, cli):
    code = mindpipe_main(["tune", "--model", GPT, "--cluster", CPU, "--out", str(tmp_path / "t"), "--budget", "2",
                          "--workers", "1", "--no-plots", "--quiet", *flags])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"mindpipe: error: {cli}"]


def test_a_trace_refusal_names_trace_and_the_profiler_option(tmp_path):
    trace = load_shipped_trace("gpt-mini.cpu")
    assert trace.flash_attention is False
    err = _refused(tmp_path, trace=trace, fixes=["flash_attention=true"])
    assert str(err) == ("fixes: flash_attention: the trace was profiled without flash attention, so it prices only "
                        "flash_attention=false: profile again with ProfileOptions.flash_attention or tune without trace")
    err = _refused(tmp_path, trace=trace, search="cp")
    assert str(err) == ("search: cp: a trace's layers ran whole sequences, so it cannot price context parallelism; "
                        "tune cp without trace (the hardware model)")
    cli = _refused(tmp_path, trace=trace, search="cp", arg_names=CLI_ARG_NAMES)
    assert str(cli) == ("--search: cp: a trace's layers ran whole sequences, so it cannot price context parallelism; "
                        "tune cp without --trace (the hardware model)")


def test_the_objective_and_the_supernet_space_name_the_keyword(tmp_path):
    """Refusals owned by the objective and the search space name the caller's argument as their source."""
    assert str(_refused(tmp_path, objective="speed")) == (
        "objective: 'speed' is not one of throughput, energy, carbon, goodput, carbon_to_target")
    assert str(_refused(tmp_path, NET, objective="energy")).startswith("objective: energy is not available for supernets")
    assert str(_refused(tmp_path, NET, clocks="perseus")) == (
        "clocks: per-stage clocks are planned for GPT and Llama models (the supernet simulator prices no energy)")
    assert str(_refused(tmp_path, NET, what_if="comm_priority")) == (
        "what_if: comm_priority: what-if knobs are not modelled for supernets")
    assert str(_refused(tmp_path, NET, partitioners=["pipedream"])) == (
        "partitioners: 'pipedream' is not a supernet partitioner (balanced, even)")
    assert str(_refused(tmp_path, NET, search="cp")) == "search: cp is not searched for supernets"
    err = _refused(tmp_path, fixes=["subnet_schedule=csp"])
    assert (err.source, err.key) == ("fixes", "subnet_schedule")


def test_a_grid_past_the_budget_names_the_configs_field(tmp_path):
    with pytest.raises(ContractError) as e:
        tune(GPT, CPU, out=tmp_path / "g", plots=False, config=SweepConfig(optimizer="grid", budget=1, workers=1))
    assert e.value.source == "config.budget" and not isinstance(e.value, NoFeasiblePlan)
    with pytest.raises(ContractError) as e:
        tune(GPT, CPU, out=tmp_path / "c", plots=False, config=SweepConfig(optimizer="grid", budget=1, workers=1),
             arg_names=CLI_ARG_NAMES)
    assert e.value.source == "--budget"


def test_renaming_keeps_the_key_the_rule_and_the_kind():
    e = NoFeasiblePlan("--fix", "tp", "tp=3 is refused")
    renamed = PYTHON_ARG_NAMES.error(e)
    assert type(renamed) is NoFeasiblePlan and (renamed.source, renamed.key, renamed.rule) == ("fixes", "tp", e.rule)
    for source in ("plan.json", "tune", ""):  # not a flag: left as it is
        other = ContractError(source, None, "x")
        assert PYTHON_ARG_NAMES.error(other) is other
    assert CLI_ARG_NAMES.error(e) is e
    with pytest.raises(ContractError) as got:
        parse_fixes(["tp"], arg_names=PYTHON_ARG_NAMES)
    assert got.value.source == "fixes"
    assert PYTHON_ARG_NAMES.given("--fix", "tp=8") == 'fixes=["tp=8"]'
    assert CLI_ARG_NAMES.given("--fix", "tp=8") == "--fix tp=8"
    assert PYTHON_ARG_NAMES.name("--budget") == "config.budget" and CLI_ARG_NAMES.name("--budget") == "--budget"


def test_an_empty_space_names_the_keywords(tmp_path):
    """The rules that emptied the space, and what to relax, in the caller's names."""
    with pytest.raises(NoFeasiblePlan) as e:
        tune(GPT, CPU, out=tmp_path / "p", plots=False, config=CFG, fixes=["tp=2", "dp=2"])
    assert str(e.value) == ("tune: no feasible plan on 2 devices: the one combination of the search space breaks a "
                            "rule — outside the values pinned by fixes. Relax fixes or change global_batch.")
    with pytest.raises(NoFeasiblePlan) as e:
        tune(GPT, CPU, out=tmp_path / "c", plots=False, config=CFG, fixes=["tp=2", "dp=2"], arg_names=CLI_ARG_NAMES)
    assert str(e.value) == ("tune: no feasible plan on 2 devices: the one combination of the search space breaks a "
                            "rule — outside the values pinned by --fix. Relax --fix or change --global-batch.")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"clocks": "perseus_per_stage"}, "clocks: 'perseus_per_stage' must be one of perseus, envpipe, default, "
                                      "perseus_action"),
    ({"clocks": "perseus", "max_slowdown": -1.0}, "max_slowdown: -1.0 is not a finite number in [0, 1]"),
    ({"clocks": "perseus", "max_slowdown": float("nan")}, "max_slowdown: nan is not a finite number in [0, 1]"),
    ({"clocks": "envpipe", "max_slowdown": True}, "max_slowdown: True is not a finite number in [0, 1]"),
])
def test_clock_arguments_are_checked_by_the_library_before_the_search(tmp_path, kwargs, message):
    # The CLI's argparse range was the only check: tune(clocks="perseus", max_slowdown=-1.0) ran the
    # search and planned clocks for a negative slowdown; an unknown method failed after the sweep.
    out = tmp_path / "t"
    with pytest.raises(ContractError) as info:
        tune(GPT, "a100-sxm4-80gb:1x8", out=out, config=CFG, plots=False, **kwargs)
    assert str(info.value) == message
    assert not out.exists()


def test_a_subnets_count_for_a_gpt_model_names_the_keyword(tmp_path):
    with pytest.raises(ContractError) as info:
        tune(GPT, CPU, out=tmp_path / "t", subnets=8, config=CFG, plots=False)
    assert str(info.value) == "subnets: subnets counts subnets of a supernet; gpt-mini is a GPT model"


@pytest.mark.parametrize(("clocks", "priced"), [(None, ("default", "perseus")), ("default", ("default",)),
                                                ("envpipe", ("default", "envpipe"))])
def test_python_carbon_to_target_prices_the_clocks_tune_is_given(tmp_path, monkeypatch, clocks, priced):
    # tune(..., clocks="default") with carbon_to_target used to price (and could choose) Perseus
    # clocks: the API built FrontConfig() whatever clocks said. The CLI passes its own front.
    import mindpipe.tuner.api as api
    from mindpipe.tuner.objectives import Objective
    from mindpipe.tuner.target import TrainingTarget

    seen = []
    monkeypatch.setattr(api, "write_front", lambda sim, result, target, placement, front, *a: seen.append(front.clocks))
    target = TrainingTarget(samples=4e6, noise_scale=48.0, reference_batch=32.0)
    tune(GPT, "a100-sxm4-80gb:1x8", out=tmp_path / "t", objective=Objective("carbon_to_target", target=target),
         config=CFG, plots=False, clocks=clocks)
    assert seen == [priced]


def test_python_carbon_to_target_refuses_per_action_clocks_before_the_search(tmp_path):
    from mindpipe.tuner.objectives import Objective
    from mindpipe.tuner.target import TrainingTarget

    target = TrainingTarget(samples=4e6, noise_scale=48.0, reference_batch=32.0)
    out = tmp_path / "t"
    with pytest.raises(ContractError, match="clocks: 'perseus_action': the carbon-to-target front plans per-stage"):
        tune(GPT, "a100-sxm4-80gb:1x8", out=out, objective=Objective("carbon_to_target", target=target),
             config=CFG, plots=False, clocks="perseus_action")
    assert not out.exists()
