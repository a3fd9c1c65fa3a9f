"""``--fix`` values a search would not honour are refused (exit 2, one line), not dropped.

Before: ``--fix partitioner=even`` was accepted and every plan evaluated used ``balanced``; with
``--objective max_batch``, ``--fix recompute=none,full`` answered 200 (recompute=none's batch, as if
nothing were pinned; ``recompute=full`` alone gives 508), and ``--fix micro_batch_size=4``,
``global_batch_size=64`` or ``partition=[12,12]`` were dropped without a word.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from mindpipe.traces.errors import ContractError
from mindpipe.tuner.keys import CLI_ARG_NAMES, parse_fixes
from mindpipe.tuner.maxbatch import tune_max_batch


def test_fix_partitioner_points_to_the_flag():
    with pytest.raises(ContractError, match="--partitioner") as e:
        parse_fixes(["partitioner=even"])
    assert e.value.source == "--fix"


@pytest.mark.parametrize("fix, needle", [
    ("recompute=none,full", "one value"),
    ("zero_stage=0,3", "one value"),
    ("schedule=1f1b,gpipe", "one value"),
    ("micro_batch_size=4", "searches the micro-batch size"),
    ("global_batch_size=64", "searches the micro-batch size"),
    ("partition=[12,12]", "--partitioner"),
    ('layer_memory_policy=["keep"]', "--partitioner"),
])
def test_max_batch_refuses_fixes_it_would_drop(tmp_path, fix, needle):
    with pytest.raises(ContractError, match=needle) as e:
        tune_max_batch("gpt-1.3b", "a100-sxm4-80gb:1x8", out=tmp_path, partitioners=["balanced"],
                       fixes=[fix, "pp=2", "tp=1"], arg_names=CLI_ARG_NAMES)
    assert e.value.source == "--fix"
    assert not list(tmp_path.iterdir())  # refused before anything is written
    with pytest.raises(ContractError) as e:  # from Python: the keyword
        tune_max_batch("gpt-1.3b", "a100-sxm4-80gb:1x8", out=tmp_path, partitioners=["balanced"],
                       fixes=[fix, "pp=2", "tp=1"])
    assert e.value.source == "fixes" and "--" not in str(e.value)


def test_max_batch_keeps_the_lists_it_searches(tmp_path):
    # dp, tp and pp lists are the meshes it searches exhaustively
    summary = tune_max_batch("gpt-1.3b", "a100-sxm4-80gb:1x8", out=tmp_path, partitioners=["balanced"],
                             fixes=["tp=1,2", "pp=2", "recompute=full"])
    assert {(r.tp, r.pp) for r in summary.results} == {(1, 2), (2, 2)}
    assert summary.best_plan is not None and summary.best_plan.recompute == "full"


def test_cli_exit_2_one_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "mindpipe.cli", "tune", "--model", "gpt-1.3b", "--cluster",
                          "a100-sxm4-80gb:1x8", "--objective", "max_batch", "--fix", "recompute=none,full",
                          "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert res.stderr.startswith("mindpipe: error: --fix: recompute=none,full")
