"""A value named twice (``--fix tp=2,2``, ``--partitioner balanced,balanced``) names one value.

Before, each repeat multiplied the space: ``--fix tp=1,2,4,1,2,4`` on a 21-point space reported
"42 valid points", a grid sweep "simulated" 42 plans, 21 of them "from a previous run" in a fresh
``--out``, spending budget on plans it had already priced.
"""

from __future__ import annotations

from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.tuner.api import build_space, tune
from mindpipe.tuner.keys import parse_fixes, point_key, read_fixes
from mindpipe.tuner.sweep import SweepConfig

SMALL = ["zero_stage=0", "recompute=none", "sequence_parallel=false", "schedule=1f1b"]


def test_fix_repeated_values_are_one_value():
    assert parse_fixes(["tp=2,2"]) == {"tp": 2}
    assert parse_fixes(["tp=1,2,1,4,2"]) == {"tp": [1, 2, 4]}
    # Spelled differently, the same boolean.
    assert parse_fixes(["sequence_parallel=true,1,yes"]) == {"sequence_parallel": True}
    assert parse_fixes(["schedule=zb_h1,1f1b,zb_h1"]) == {"schedule": ["zb_h1", "1f1b"]}
    assert read_fixes({"tp": [4, 4, 2]}) == {"tp": [4, 2]}


def test_space_has_each_point_once():
    model, cluster = load_model("gpt-1.3b"), load_cluster("a100-sxm4-80gb:1x4")
    plain = build_space(model, cluster, 16, SMALL, ["balanced", "even"])
    twice = build_space(model, cluster, 16, [*SMALL, "tp=1,2,4,1,2,4"], ["balanced", "even", "balanced"])
    keys = [point_key(p) for p in twice.points]
    assert len(keys) == len(set(keys))
    assert twice.size == plain.size
    assert twice.partitioners == ("balanced", "even")


def test_grid_sweep_prices_each_plan_once(tmp_path):
    cfg = SweepConfig(optimizer="grid", budget=100, workers=1)
    once = tune("gpt-1.3b", "a100-sxm4-80gb:1x4", out=tmp_path / "once", global_batch=16, fixes=SMALL,
                config=cfg, plots=False).summary
    twice = tune("gpt-1.3b", "a100-sxm4-80gb:1x4", out=tmp_path / "twice", global_batch=16,
                 fixes=[*SMALL, "tp=1,2,4,1,2,4"], partitioners=["balanced", "balanced"], config=cfg,
                 plots=False).summary
    assert twice.reused == 0  # a fresh --out: nothing came from a previous run
    assert twice.evaluations == twice.space_size == once.space_size == once.evaluations
    assert twice.best_value == once.best_value


def test_max_batch_tries_each_partitioner_once(tmp_path):
    from mindpipe.tuner.maxbatch import tune_max_batch

    summary = tune_max_batch("gpt-1.3b", "a100-sxm4-80gb:1x8", out=tmp_path, partitioners=["even", "even"],
                             fixes=["pp=2", "tp=1"])
    assert [(r.partitioner, r.dp, r.tp, r.pp) for r in summary.results] == [("even", 4, 1, 2)]
