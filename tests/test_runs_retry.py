"""The closed loop's runs: a native crash of a rank is measured again once; other failures are not."""

from __future__ import annotations

import subprocess

import pytest
from mindpipe.traces.config import Plan

from mindpipe import runs

CRASH = ("mindpipe: error: rank 1 was killed by SIGABRT without a Python error "
         "(full log: /tmp/mindpipe-run-x.log)\n")
INPUT_ERROR = "mindpipe: error: plan.json: tp=3 does not divide num_heads=4\n"


def _fake(outcomes: list[tuple[int, str]], calls: list[list[str]]):
    def run(cmd, **_kw):
        calls.append(cmd)
        code, err = outcomes[len(calls) - 1]
        return subprocess.CompletedProcess(cmd, code, "", err)
    return run


def test_a_crashed_rank_is_run_again_once_and_said(monkeypatch, tmp_path):
    calls: list[list[str]] = []
    monkeypatch.setattr(runs.subprocess, "run", _fake([(1, CRASH), (0, "")], calls))
    monkeypatch.setattr(runs.Trace, "load", staticmethod(lambda path: "trace"))
    said: list[str] = []
    assert runs.run_plan(Plan(dp=2, micro_batch_size=2, global_batch_size=8), "gpt-mini", tmp_path / "m.json",
                         log=said.append) == "trace"
    assert len(calls) == 2 and calls[0] == calls[1]
    assert "killed by SIGABRT" in said[0] and said[0].endswith("running it again")


@pytest.mark.parametrize("outcomes", [[(2, INPUT_ERROR)], [(1, CRASH), (1, CRASH)]])
def test_input_errors_and_repeated_crashes_fail(monkeypatch, tmp_path, outcomes):
    calls: list[list[str]] = []
    monkeypatch.setattr(runs.subprocess, "run", _fake(outcomes, calls))
    with pytest.raises(runs.PlanRunFailed):
        runs.run_plan(Plan(dp=2, micro_batch_size=2, global_batch_size=8), "gpt-mini", tmp_path / "m.json")
    assert len(calls) == len(outcomes)
