"""The ``nongemm`` block policy (DawnPiper's per-operator memory plan, issue 16) runs: a block keeps
its GEMM outputs and re-runs everything else under torch's selective activation checkpointing, and
training matches the single-process losses on CPU/gloo (pp2 1F1B, dp2; GPT and Llama), with the
accounted memory within 10 % of the simulator's."""

from __future__ import annotations

import pytest
from mindpipe.traces.config import Model, Plan, check_plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.trace import Trace

from .conftest import TINY, run_plan
from .test_exec_memory_runs import assert_memory_matches_simulator
from .test_exec_parity import assert_parity, launched, reference

# Dropout on: the MLP-dropout mask is re-drawn from fc2's kept output, the others from re-run ops.
DROP = {**TINY, "dropout": 0.1, "name": "tiny4-dropout"}
POLICY = ["nongemm", "keep", "nongemm", "recompute"]
PP2 = {"pp": 2, "micro_batch_size": 2, "global_batch_size": 8, "schedule": "1f1b", "precision": "fp32",
       "layer_memory_policy": POLICY}
DP2 = {"dp": 2, "micro_batch_size": 2, "global_batch_size": 8, "zero_stage": 0, "precision": "fp32",
       "layer_memory_policy": ["nongemm"] * 4}


def test_pp2_1f1b_nongemm_parity_and_memory(tmp_path):
    trace = launched(tmp_path, PP2, 2)
    assert_parity(trace.measurement.losses, reference(PP2))
    assert_memory_matches_simulator(trace, TINY, rel=0.10)


def test_pp2_nongemm_with_dropout_matches_keep(tmp_path):
    """With dropout a pipelined run draws its masks in another order than one process, so the
    reference is the same plan with every block kept: the re-drawn masks (from the restored RNG
    state) are the forward's."""
    losses = []
    for name, policy in (("nongemm", POLICY), ("keep", ["keep"] * 4)):
        (tmp_path / name).mkdir()
        res = run_plan(tmp_path / name, {**PP2, "layer_memory_policy": policy}, 2, model=DROP)
        assert res.returncode == 0, res.stderr[-4000:]
        losses.append(Trace.load(tmp_path / name / "measured.json").measurement.losses)
    assert_parity(*losses)


def test_dp2_nongemm_parity_and_memory(tmp_path):
    trace = launched(tmp_path, DP2, 2)
    assert_parity(trace.measurement.losses, reference(DP2))
    assert_memory_matches_simulator(trace, TINY, rel=0.10)


def test_llama_pp2_nongemm_parity_and_memory(tmp_path):
    """Llama's Q, K, V, output projection, gate and up outputs are kept (down's input is f wide);
    RMSNorm (a custom autograd function), RoPE and SwiGLU re-run."""
    from .test_exec_llama import LLAMA

    plan = {**PP2, "layer_memory_policy": ["nongemm", "keep", "nongemm", "nongemm"]}
    res = run_plan(tmp_path, plan, 2, model=LLAMA)
    assert res.returncode == 0, res.stderr[-4000:]
    trace = Trace.load(tmp_path / "measured.json")
    assert_parity(trace.measurement.losses, reference(plan, LLAMA))
    assert_memory_matches_simulator(trace, LLAMA, rel=0.10)


@pytest.mark.parametrize(("keys", "rule"), [({"tp": 2}, "needs tp=1"),
                                             ({"pp": 2, "schedule": "zb_h1"}, "split backward")])
def test_nongemm_refused_where_it_cannot_run(keys, rule):
    """TP (unreduced partial sums, re-issued collectives) and a split backward (torch's selective
    checkpointing allows one backward per region) are refused by the plan rules, so no planner
    chooses it there."""
    plan = Plan(micro_batch_size=2, global_batch_size=8, layer_memory_policy=["nongemm"] * 4, **keys)
    with pytest.raises(ContractError, match=rule):
        check_plan(plan, Model(**TINY))
