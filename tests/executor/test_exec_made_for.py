"""Plans carry what they were made for (``plan.made_for``): the run takes the model from there and
refuses a launch that does not match, saying what the plan was tuned for."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
from mindpipe.executor.config import add_run_arguments, config_from_args
from mindpipe.executor.precheck import check_made_for, what_if_notes
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.config import MadeFor, Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import to_dict
from mindpipe.traces.trace import Trace

from .conftest import TINY, mindpipe

PLAN: dict[str, Any] = {"pp": 2, "micro_batch_size": 1, "global_batch_size": 2, "precision": "fp32"}


def _tuned(cluster: str = "cpu:1x2", model: str = "gpt-mini", **plan: Any) -> dict[str, Any]:
    made = MadeFor(model=load_model(model), cluster=load_cluster(cluster), what_if=plan.pop("what_if", []))
    return {**PLAN, **plan, "made_for": to_dict(made)}


def _args(plan: dict[str, Any], *extra: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_run_arguments(p, launcher=True)
    return p.parse_args([json.dumps(plan), "--nproc", "2", "--steps", "2", *extra])


def test_a_tuned_plan_runs_without_model(tmp_path):
    plan = tmp_path / "best_plan.json"
    plan.write_text(json.dumps(_tuned(comm_priority="pp_first", what_if=["comm_priority"])))
    res = mindpipe("run", str(plan), "--nproc", "2", "--steps", "2", "--out", str(tmp_path / "m.json"),
                   "--run-timeout", "300", "--timeout", "120")
    assert res.returncode == 0, res.stderr[-3000:]
    trace = Trace.load(tmp_path / "m.json")
    assert trace.model is not None and trace.model.same_shape(load_model("gpt-mini"))
    assert len(trace.measurement.losses) == 2
    # The what-if knob is named, and what ran is recorded.
    notes = [ln for ln in res.stderr.splitlines() if ln.startswith("mindpipe: note: what-if knobs")]
    assert len(notes) == 1 and "comm_priority=pp_first" in notes[0], res.stderr[-3000:]
    assert trace.measurement.plan.comm_priority == "fair" and "comm_priority=pp_first is a what-if knob" in \
        trace.provenance.notes


@pytest.mark.parametrize(
    ("plan", "extra", "needle"),
    [
        (_tuned(), ("--model", json.dumps(TINY)), "made_for: the plan was tuned for gpt-mini; --model gives tiny4"),
        (_tuned(), ("--nproc", "1"), "dp×tp×pp=1×1×2=2 ranks needed, this launch has 1; "
                                     "the plan was tuned for gpt-mini on cpu:1x2 (2 devices)"),
        (_tuned("a100-sxm4-80gb:1x2"), ("--device", "cpu"),
         "made_for: the plan was tuned for gpt-mini on a100-sxm4-80gb:1x2 (2 devices), GPUs; this launch runs on the CPU"),
    ],
    ids=["model", "world-size", "device-kind"],
)
def test_a_launch_that_does_not_match_is_refused(tmp_path, plan, extra, needle):
    path = tmp_path / "best_plan.json"
    path.write_text(json.dumps(plan))
    res = mindpipe("run", str(path), "--nproc", "2", "--steps", "2", *extra, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [f"mindpipe: error: {path}: {needle}"]


def test_model_resolution():
    assert config_from_args(_args(PLAN)).model == load_model("gpt-mini")  # a hand-written plan
    tiny = Model(**TINY)
    tuned_tiny = {**PLAN, "made_for": to_dict(MadeFor(model=tiny, cluster=load_cluster("cpu:1x2")))}
    assert config_from_args(_args(tuned_tiny)).model == tiny
    # Another name for the same network is the same model.
    assert config_from_args(_args(tuned_tiny, "--model", json.dumps({**TINY, "name": "other"}))).model.name == "other"
    with pytest.raises(ContractError, match=r"^<inline plan>: made_for: the plan was tuned for tiny4; --model gives gpt-mini$"):
        config_from_args(_args(tuned_tiny, "--model", "gpt-mini"))


def test_made_for_checks_and_what_if_notes():
    gpu_plan = Plan(**{**PLAN, "made_for": MadeFor(load_model("gpt-mini"), load_cluster("a100-sxm4-80gb:1x2"))})
    check_made_for(gpu_plan, 2, "cuda")
    cpu_plan = Plan(**{**PLAN, "made_for": MadeFor(load_model("gpt-mini"), load_cluster("cpu:1x2"))})
    with pytest.raises(ContractError, match=r"tuned for gpt-mini on cpu:1x2 \(2 devices\), CPUs; this launch runs on CUDA"):
        check_made_for(cpu_plan, 2, "cuda")
    check_made_for(Plan(**PLAN), 5, "cuda")  # a hand-written plan: nothing to compare with
    # tuned for 2 devices, pp edited down to 1, launched on 2: the mesh is named, and the edit
    edited = Plan(**{**PLAN, "pp": 1, "made_for": MadeFor(load_model("gpt-mini"), load_cluster("cpu:1x2"))})
    with pytest.raises(ContractError, match=r"^plan: dp×tp×pp=1×1×1=1 ranks needed, this launch has 2; the plan "
                                            r"was tuned for gpt-mini on cpu:1x2 \(2 devices\), so it was edited since$"):
        check_made_for(edited, 2, "cpu")
    assert what_if_notes(Plan(**PLAN)) == []
    dp_plan = Plan(dp=2, global_batch_size=2, comm_priority="pp_first", overlap_grad_reduce=True)
    (note,) = what_if_notes(dp_plan)
    assert note.startswith("what-if knobs the simulator models but the executor does not carry out: ")
    assert "comm_priority=pp_first" in note and "overlap_grad_reduce=true" in note
    assert what_if_notes(Plan(dp=2, global_batch_size=2, overlap_grad_reduce=False)) == []
    (note,) = what_if_notes(Plan(pp=2, global_batch_size=2, blocking_p2p=True))
    assert "blocking_p2p=true (torch.distributed.pipelining's runtime leaves sends in flight" in note
