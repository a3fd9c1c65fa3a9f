"""``mindpipe run`` names its plan in every refusal as ``simulate`` does: the file the user gave, or
``<inline plan>`` for inline JSON (:func:`mindpipe.traces.builtin.config_source`), whichever check refuses
it (the plan's contract, the model it was tuned for, the launch pre-check)."""

from __future__ import annotations

import json

import pytest
from mindpipe.traces.builtin import load_model
from mindpipe.traces.schema import to_dict

from mindpipe.cli import main

TP3 = '{"tp": 3, "global_batch_size": 4}'


def _refusal(capsys, argv: list[str]) -> str:
    rc = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1, err
    return lines[0]


def _run(plan: str, tmp_path, *extra: str) -> list[str]:
    return ["run", plan, "--nproc", "3", "--steps", "2", "--out", str(tmp_path / "m.json"), *extra]


def test_an_inline_plan_is_named_as_simulate_names_it(capsys, tmp_path):
    ran = _refusal(capsys, _run(TP3, tmp_path))
    simulated = _refusal(capsys, ["simulate", "--model", "gpt-mini", "--cluster", "cpu:1x3", "--plan", TP3])
    assert ran == simulated == "mindpipe: error: <inline plan>: tp=3 does not divide num_heads=8"
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize(("plan", "nproc", "rule"), [
    ('{"dp": 2, "global_batch_size": 2}', "1", "dp×tp×pp=2×1×1=2 ranks needed, the launch has 1"),
    ('{"precision": "fp16"}', "1", "precision 'fp16' needs loss scaling"),
    ('{"pp": 2, "global_batch_size": 1}', "2", "global_batch_size: schedule '1f1b' needs micro-batches m=1 >= pp=2"),
    ('{"dp": ', "1", "malformed JSON"),
])
def test_every_check_names_an_inline_plan_alike(capsys, tmp_path, plan, nproc, rule):
    line = _refusal(capsys, ["run", plan, "--nproc", nproc, "--steps", "2", "--out", str(tmp_path / "m.json")])
    assert line.startswith(f"mindpipe: error: <inline plan>: {rule}"), line


def test_a_plan_tuned_for_another_model_names_the_inline_plan(capsys, tmp_path):
    made_for = {"model": to_dict(load_model("gpt-mini")), "cluster": {"gpu": "cpu", "num_nodes": 1, "gpus_per_node": 1}}
    plan = json.dumps({"made_for": made_for})
    line = _refusal(capsys, ["run", plan, "--nproc", "1", "--steps", "2", "--out", str(tmp_path / "m.json"),
                             "--model", "llama-tiny"])
    assert line == "mindpipe: error: <inline plan>: made_for: the plan was tuned for gpt-mini; --model gives llama-tiny"


def test_a_plan_file_is_named_by_its_path(capsys, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(TP3)
    line = _refusal(capsys, _run(str(path), tmp_path))
    assert line == f"mindpipe: error: {path}: tp=3 does not divide num_heads=8"


def test_the_executor_started_directly_names_the_plan_alike(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}
    path = tmp_path / "p.json"
    path.write_text('{"dp": 2, "global_batch_size": 2}')
    for plan, name in (('{"dp": 2, "global_batch_size": 2}', "<inline plan>"), (str(path), str(path))):
        res = subprocess.run([sys.executable, "-m", "mindpipe.executor", plan, "--steps", "1", "--out",
                              str(tmp_path / "m.json")], capture_output=True, text=True, env=env, timeout=120)
        assert res.returncode == 2
        assert res.stderr.strip() == f"executor: error: {name}: dp×tp×pp=2×1×1=2 ranks needed, the launch has 1"
