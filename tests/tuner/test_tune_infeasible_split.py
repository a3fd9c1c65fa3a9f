"""The summary tells the simulations that were infeasible from what was refused before simulating.

Before, ``mindpipe tune`` printed ``infeasible 83: 26 combinations filtered by the plan rules,
out_of_memory 57`` when every one of the 83 was refused before any simulation: the 26 broke a plan
rule (never plans) and the 57 did not fit the memory estimate; an out-of-memory plan at its
simulated peak was counted with them. ``infeasible`` and ``infeasible_by_reason`` keep their
meaning in the JSON; ``infeasible_simulated`` and ``refused_before_simulation`` split them.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
from mindpipe.tuner.api import tune
from mindpipe.tuner.keys import point_key
from mindpipe.tuner.objectives import Objective, parse_constraint
from mindpipe.tuner.records import EvaluationRecord, MemoryCode, Metrics, Status
from mindpipe.tuner.sweep import SweepConfig

from mindpipe.cli import main as mindpipe_main
from mindpipe.cli.tune import _infeasible


def _split_adds_up(summary: dict[str, Any]) -> None:
    simulated, refused = summary["infeasible_simulated"], summary["refused_before_simulation"]
    assert sum(simulated.values()) + sum(refused.values()) == summary["infeasible"]
    for reason, n in summary["infeasible_by_reason"].items():
        assert simulated.get(reason, 0) + refused.get(reason, 0) == n


def test_refusals_are_not_counted_as_simulated_plans(tmp_path, capsys):
    out = tmp_path / "t"
    argv = ["tune", "--model", "gpt-13b", "--cluster", "a100-sxm4-40gb:1x8", "--budget", "4", "--workers", "1",
            "--optimizer", "random", "--out", str(out), "--no-plots", "--quiet"]
    assert mindpipe_main(argv) == 0
    text = {line[:16].strip(): line[17:] for line in capsys.readouterr().out.splitlines()}
    summary = json.loads((out / "summary.json").read_text())
    table = pd.read_csv(out / "evaluations.csv")
    estimate = int(((table["code"] == "memory_estimate") & ~table["simulated"]).sum())
    rules = summary["infeasible_by_reason"]["rules"]
    assert estimate > 0 and rules > 0
    assert summary["refused_before_simulation"] == {"out_of_memory": estimate, "rules": rules}
    assert summary["infeasible_simulated"] == {}
    _split_adds_up(summary)
    assert text["infeasible"] == "none of the 4 simulations"
    assert text["refused"] == (f"{estimate + rules} before simulating: {rules} combinations broke a plan rule, "
                               f"{estimate} plans did not fit the memory estimate")


def _priced(problem: Any, point: Any) -> EvaluationRecord:
    """A simulation by rule of thumb: out of memory at its simulated peak for pp=1, else dp samples/s."""
    rec = EvaluationRecord(point_key(point), dict(point), simulated=True,
                           metrics=Metrics(iteration_time_s=1.0, throughput_samples_per_s=float(point["dp"])))
    if point["pp"] == 1:
        rec.status, rec.code = Status.OUT_OF_MEMORY, MemoryCode.SIMULATED_PEAK
    return rec


def test_simulated_infeasible_plans_are_counted_per_reason(tmp_path):
    objective = Objective("throughput", constraints=[parse_constraint("throughput>=2")])
    outcome = tune("gpt-mini", "cpu:1x4", out=tmp_path / "t", plots=False, objective=objective, evaluator=_priced,
                   screen=None, config=SweepConfig(optimizer="grid", budget=1000, workers=1),
                   fixes=["schedule=1f1b", "recompute=none", "zero_stage=0", "micro_batch_size=1"])
    records = outcome.result.records
    s = outcome.summary.to_dict()
    oom = sum(1 for r in records if r.point["pp"] == 1)
    slow = sum(1 for r in records if r.point["pp"] > 1 and r.point["dp"] < 2)
    assert oom > 0 and slow > 0 and s["evaluations"] == len(records)
    assert s["infeasible_simulated"] == {"out_of_memory": oom, "constraint": slow}
    assert set(s["refused_before_simulation"]) <= {"rules"}
    _split_adds_up(s)
    lines = _infeasible(outcome.summary)
    assert lines[0] == (f"infeasible       {oom + slow} of the {len(records)} simulations: "
                        f"constraint {slow}, out_of_memory {oom}")
