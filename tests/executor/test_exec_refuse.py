"""Plans that cannot work are refused before any rank starts, with one clear line (exit code 2)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys

import pytest
from mindpipe.executor.config import add_run_arguments
from mindpipe.executor.launch import cmd_run
from mindpipe.executor.precheck import check_run
from mindpipe.traces.builtin import load_model
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.errors import ContractError

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


def simulator_memory_check(model, plan, device, ranks_per_device):
    """What ``mindpipe run`` injects: the simulator's memory model, refusing a plan that does not fit."""
    from mindpipe.cli.run import memory_check

    return memory_check(model, plan, device, ranks_per_device)


def _launcher_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_run_arguments(p, launcher=True)
    return p.parse_args(list(argv))


def test_plan_that_does_not_fit_is_refused(capsys):
    # gpt-1.3b, pp=2 in fp32: ~35 GiB per pipeline rank (simulator memory model) on a CPU host
    # whose catalog entry has ~24 GiB, shared by both ranks. The memory model is injected (the
    # executor does not import the simulator); the refusal comes before anything is launched.
    argv = ['{"pp": 2, "global_batch_size": 8, "micro_batch_size": 2, "precision": "fp32"}', "--nproc", "2",
            "--steps", "2", "--model", "gpt-1.3b"]
    with pytest.raises(ContractError) as e:
        cmd_run(_launcher_args(*argv), argv, memory_check=simulator_memory_check)
    msg = str(e.value)
    assert msg.startswith("<inline plan>: pipeline rank 0 needs an estimated ")
    assert "× 2 ranks sharing it (simulator memory model: weights" in msg and "but cpu has" in msg
    assert "torch.distributed.run" not in capsys.readouterr().err  # nothing was launched


def test_mindpipe_run_refuses_a_plan_that_does_not_fit():
    res = _run('{"pp": 2, "global_batch_size": 8, "micro_batch_size": 2, "precision": "fp32"}', "--nproc", "2",
               model="gpt-1.3b")
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("mindpipe: error: <inline plan>: pipeline rank 0 needs an estimated ") and "but cpu has" in line
    assert "torch.distributed.run" not in res.stderr


def test_without_a_memory_model_the_precheck_says_so():
    plan = Plan(pp=2, global_batch_size=8, micro_batch_size=2, precision="fp32")
    pre = check_run(load_model("gpt-1.3b"), plan, 2, "cpu", get_device("cpu"), ranks_per_device=2)
    assert pre.memory_gib is None and any(n.startswith("memory pre-check skipped: the caller gave no memory model") for n in pre.notes)
    fits = check_run(Model(**TINY), plan, 2, "cpu", get_device("cpu"), ranks_per_device=2,
                     memory_check=simulator_memory_check)
    assert fits.memory_gib is not None and len(fits.memory_gib) == 2 and 0 < max(fits.memory_gib) < fits.capacity_gib


def test_python_m_executor_refuses_a_world_size_mismatch():
    # Outside torchrun the world size is 1, so a 2-rank plan is refused (before torch is imported).
    res = subprocess.run([sys.executable, "-m", "mindpipe.executor", '{"pp": 2, "global_batch_size": 4}', "--steps", "1",
                          "--model", json.dumps(TINY)], capture_output=True, text=True, env=run_env(), cwd=REPO,
                         timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip() == "executor: error: <inline plan>: dp×tp×pp=1×1×2=2 ranks needed, the launch has 1"


def test_a_memory_refusal_suggests_swap_unless_the_plan_swaps():
    """Next to recompute, the refusal names vPipe's swap (per block, or planned by the tuner)."""
    model = load_model("gpt-1.3b")
    keep = Plan(pp=2, global_batch_size=8, micro_batch_size=2, precision="fp32")
    with pytest.raises(ContractError) as err:
        check_run(model, keep, 2, "cpu", get_device("cpu"), memory_check=simulator_memory_check, memory_budget_gib=0.5)
    assert "recompute" in err.value.rule and 'layer_memory_policy "swap"' in err.value.rule
    assert "mindpipe tune --partitioner vpipe,dawnpiper" in err.value.rule
    assert err.value.rule.endswith("(emulated by --memory-budget-gib 0.5)")
    swapping = dataclasses.replace(keep, layer_memory_policy=["swap"] + ["keep"] * (model.num_layers - 1))
    with pytest.raises(ContractError) as err:
        check_run(model, swapping, 2, "cpu", get_device("cpu"), memory_check=simulator_memory_check, memory_budget_gib=0.5)
    assert "needs an estimated" in err.value.rule and "swap" not in err.value.rule


def test_a_warm_up_that_leaves_nothing_to_time_is_said(tmp_path):
    # --warmup-steps 5 of a 2-step run: the run still times its steps, and says that it does so.
    out = tmp_path / "m.json"
    res = _run('{"global_batch_size": 2}', "--nproc", "1", "--warmup-steps", "5", "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "mindpipe: note: --warmup-steps 5 would leave nothing to time of this run's 2 steps: every step is timed" in res.stderr
    from mindpipe.traces.trace import Trace

    assert Trace.load(out).measurement.warmup_steps == 0
    quiet = _run('{"global_batch_size": 2}', "--nproc", "1", "--out", str(tmp_path / "q.json"))
    assert quiet.returncode == 0 and "--warmup-steps" not in quiet.stderr


def test_a_ranks_note_reaches_the_user(tmp_path):
    # A rank's output goes to the run's log (dropped when the run succeeds): a note it leaves in the
    # run directory is printed by the launcher. Here: a resume under another data-parallel split.
    ck = str(tmp_path / "ck")
    plan = {"micro_batch_size": 2, "global_batch_size": 8, "precision": "fp32"}
    first = _run(json.dumps(plan), "--nproc", "1", "--checkpoint-dir", ck, "--out", str(tmp_path / "a.json"))
    assert first.returncode == 0, first.stderr[-2000:]
    res = mindpipe("run", json.dumps({**plan, "dp": 2}), "--nproc", "2", "--steps", "3", "--model", json.dumps(TINY),
                   "--checkpoint-dir", ck, "--resume", "--out", str(tmp_path / "b.json"), timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert ("mindpipe: note: the checkpoint's noise-scale averages were taken with method microbatch; this plan "
            "measures data_parallel: the noise scale starts afresh") in res.stderr


def test_a_need_just_over_the_budget_is_printed_with_the_digits_that_tell_them_apart():
    """A budget a hair under the estimate printed "needs 0.07 GiB ... but cpu has 0.07 GiB"."""
    model, plan, cpu = load_model("gpt-mini"), Plan(dp=2, micro_batch_size=1, global_batch_size=2), get_device("cpu")
    (need,) = simulator_memory_check(model, plan, cpu, 1)
    tight = dataclasses.replace(cpu, memory_capacity_bytes=int(need * 0.999 * 2**30))  # as --memory-budget-gib does
    with pytest.raises(ContractError) as e:
        simulator_memory_check(model, plan, tight, 1)
    m = re.search(r"needs an estimated ([\d.]+) GiB .* but cpu has ([\d.]+) GiB", e.value.rule)
    assert m is not None and m.group(1) != m.group(2) and float(m.group(1)) > float(m.group(2)), e.value.rule
