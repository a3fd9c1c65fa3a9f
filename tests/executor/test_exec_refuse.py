"""Plans that cannot work are refused before any rank starts, with one clear line (exit code 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import REPO, TINY, mindpipe, run_env


def _run(plan: str, *extra: str, model: dict | str = TINY) -> subprocess.CompletedProcess[str]:
    model_arg = model if isinstance(model, str) else json.dumps(model)
    return mindpipe("run", plan, "--steps", "2", "--model", model_arg, *extra, timeout=120)


@pytest.mark.parametrize(
    ("plan", "nproc", "needle"),
    [
        ('{"dp": 2, "global_batch_size": 4}', "1", "dp×tp×pp=2×1×1=2 ranks needed, the launch has 1"),
        ('{"tp": 3, "global_batch_size": 4}', "3", "tp=3 does not divide num_heads=4"),
        ('{"pp": 2, "global_batch_size": 4, "stages": 2}', "2", "stages: unknown key"),
        ('{"pp": 2, "global_batch_size": ', "2", "malformed JSON"),
        ('{"pp": 2, "global_batch_size": 4, "precision": "fp16"}', "2", "needs loss scaling"),
        ('{"pp": 2, "global_batch_size": 1}', "2", "needs micro-batches m=1 >= pp=2"),
        ('{"pp": 2, "global_batch_size": 4, "partition": [3, 3]}', "2", "partition sums to 6 layers"),
    ],
)
def test_refused_before_launch(plan, nproc, needle):
    res = _run(plan, "--nproc", nproc)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[-1].startswith("mindpipe: error: ") and needle in lines[-1], res.stderr
    assert "torch.distributed.run" not in res.stderr  # nothing was launched
    assert res.stdout == ""


def test_plan_that_does_not_fit_is_refused():
    # gpt-1.3b, pp=2 in fp32: ~35 GiB per pipeline rank (simulator memory model) on a CPU host
    # whose catalog entry has ~24 GiB, shared by both ranks.
    res = _run('{"pp": 2, "global_batch_size": 8, "micro_batch_size": 2, "precision": "fp32"}', "--nproc", "2",
               model="gpt-1.3b")
    assert res.returncode == 2, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("mindpipe: error: plan: pipeline rank 0 needs an estimated ")
    assert "× 2 ranks sharing it (simulator memory model: weights" in last and "but cpu has" in last
    assert "torch.distributed.run" not in res.stderr


def test_python_m_executor_refuses_a_world_size_mismatch():
    # Outside torchrun the world size is 1, so a 2-rank plan is refused (before torch is imported).
    res = subprocess.run([sys.executable, "-m", "mindpipe.executor", '{"pp": 2, "global_batch_size": 4}', "--steps", "1",
                          "--model", json.dumps(TINY)], capture_output=True, text=True, env=run_env(), cwd=REPO,
                         timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip() == "executor: error: plan: dp×tp×pp=1×1×2=2 ranks needed, the launch has 1"
