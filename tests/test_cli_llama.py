"""``kind: llama`` through the CLI: profile, simulate (built-ins and a trace), tune, and the one-line refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from mindpipe.traces.builtin import load_model
from mindpipe.traces.catalog import get_device
from mindpipe.traces.flops import model_flops_per_iteration


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mindpipe.cli", *args], capture_output=True, text=True, timeout=300)


PLAN_8B = {"dp": 2, "tp": 4, "pp": 1, "micro_batch_size": 1, "global_batch_size": 64, "recompute": "selective",
           "sequence_parallel": True, "zero_stage": 1, "precision": "bf16"}


def test_simulate_llama3_8b_on_h100():
    res = run("simulate", "--model", "llama3-8b", "--cluster", "h100-sxm5-80gb:1x8", "--plan", json.dumps(PLAN_8B),
              "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["fits_in_memory"] and out["iteration_time_s"] > 0
    # MFU is the Llama model-FLOPs count (GQA, SwiGLU) over the iteration on 8 devices.
    m = load_model("llama3-8b")
    peak = get_device("h100-sxm5-80gb").peak_flops("bf16")
    expected = model_flops_per_iteration(m, 64) / out["iteration_time_s"] / 8 / peak
    assert out["mfu"] == pytest.approx(expected, rel=1e-3)


def _simulate_stdout(model: str, plan: dict) -> str:
    res = run("simulate", "--model", model, "--cluster", "h100-sxm5-80gb:1x8", "--plan", json.dumps(plan))
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_simulate_says_when_a_llama_plan_on_gpus_runs_the_explicit_attention_kernels():
    hint = "Llama recipes run a fused kernel on GPUs"
    assert hint in _simulate_stdout("llama3-8b", PLAN_8B)
    assert hint not in _simulate_stdout("llama3-8b", {**PLAN_8B, "flash_attention": True})
    assert hint not in _simulate_stdout("gpt-13b", PLAN_8B)


def test_simulate_says_a_llama_plan_prices_the_executors_eager_elementwise_kernels():
    hint = "norms, rotary, SwiGLU eager PyTorch kernels, as the executor runs them"
    assert hint in _simulate_stdout("llama3-8b", PLAN_8B)
    fused = _simulate_stdout("llama3-8b", {**PLAN_8B, "fused_elementwise": True})
    assert hint not in fused and "what-if knobs         fused_elementwise=true" in fused
    assert hint not in _simulate_stdout("gpt-13b", PLAN_8B)


def test_tp_beyond_kv_heads_is_one_line_exit_2():
    plan = {**PLAN_8B, "dp": 1, "tp": 16, "sequence_parallel": False, "zero_stage": 0, "global_batch_size": 8}
    res = run("simulate", "--model", "llama3-8b", "--cluster", "h100-sxm5-80gb:2x8", "--plan", json.dumps(plan))
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "tp=16 does not divide num_kv_heads=8" in res.stderr


def test_profile_llama_tiny_then_simulate_with_its_trace(tmp_path):
    trace = tmp_path / "llama.json"
    res = run("profile", "llama-tiny", "--device", "cpu", "--warmup", "0", "--repeats", "1", "--out", str(trace),
              "--json")
    assert res.returncode == 0, res.stderr
    payload = json.loads(res.stdout)
    assert payload["model"] == "llama-tiny" and payload["num_records"] == 7
    plan = json.dumps({"pp": 2, "micro_batch_size": 1, "global_batch_size": 4, "precision": "fp32"})
    res = run("simulate", "--model", "llama-tiny", "--cluster", "cpu:1x2", "--plan", plan, "--trace", str(trace),
              "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["iteration_time_s"] > 0


def test_tune_llama3_70b(tmp_path):
    res = run("tune", "--model", "llama3-70b", "--cluster", "h100-sxm5-80gb:8x8", "--global-batch", "512",
              "--budget", "8", "--optimizer", "random", "--seed", "0", "--out", str(tmp_path), "--no-plots", "--json")
    assert res.returncode == 0, res.stderr
    best = json.loads((tmp_path / "best_plan.json").read_text())
    assert best["made_for"]["model"]["kind"] == "llama" and best["made_for"]["model"]["num_kv_heads"] == 8
    assert 8 % best["tp"] == 0
