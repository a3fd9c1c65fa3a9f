"""The CLI as a user runs it: one-line errors with exit code 2, clean JSON on stdout."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

TINY = '{"kind":"gpt","num_layers":2,"hidden_size":32,"num_heads":2,"seq_len":16,"vocab_size":64,"name":"tiny"}'


def run(*args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mindpipe.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def tiny_trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "tiny.json"
    res = run("profile", TINY, "--micro-batch-size", "2", "--warmup", "0", "--repeats", "2", "--out", str(out), "--json")
    assert res.returncode == 0, res.stderr
    return out, res


def test_profile_json_is_one_object(tiny_trace):
    out, res = tiny_trace
    payload = json.loads(res.stdout)  # exactly one JSON document, nothing else on stdout
    assert payload["num_records"] == 5 and payload["out"] == str(out)
    assert payload["model"] == "tiny" and payload["granularity"] == "layer"
    assert "profiling block.1 (3/5)" in res.stderr  # progress goes to stderr
    assert out.exists()


def test_inspect(tiny_trace):
    out, _ = tiny_trace
    res = run("inspect", str(out), "--model", TINY)
    assert res.returncode == 0, res.stderr
    assert "block.0" in res.stdout and "per-layer sum / step" in res.stdout


def test_import_aicb_cli(tmp_path, shared_data):
    src = shared_data / "traces/aicb_a100/L7B-M1-C04_Llama7B_megatron_tp2_pp1_mbs1_A100.txt"
    res = run("import", "aicb", str(src), "--out", str(tmp_path / "l7b.json"), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["tp"] == 2
    # inspect --model cannot check a trace that names no model: it says so instead of passing it
    res = run("inspect", str(tmp_path / "l7b.json"), "--model", TINY)
    assert res.returncode == 0 and "records no model (e.g. imported without --model): not checked against" in res.stderr
    assert "not checked" not in run("inspect", str(tmp_path / "l7b.json")).stderr
    # the simulator prices blocks: an AICB trace (half-block units) is refused, naming what it holds
    res = run("simulate", "--model", TINY, "--cluster", "a100-sxm4-80gb:1x2",
              "--trace", str(tmp_path / "l7b.json"), "--plan", '{"tp":2,"micro_batch_size":1,"global_batch_size":1}')
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "the trace has no block records (its kinds: " in res.stderr and "attention_layer" in res.stderr


def _model_file(tmp_path, text):
    p = tmp_path / "model.json"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize(
    ("make_args", "needle"),
    [
        (lambda t, tr: ["profile", _model_file(t, '{"kind": "gpt",'), "--out", "x.json"], "model.json: malformed JSON at line 1"),
        (lambda t, tr: ["profile", _model_file(t, '{"kind": "gpt"}'), "--out", "x.json"], "model.json: num_layers: missing required key"),
        (lambda t, tr: ["profile", _model_file(t, TINY[:-1] + ',"depth": 3}'), "--out", "x.json"], "model.json: depth: unknown key"),
        (lambda t, tr: ["profile", _model_file(t, TINY.replace('"hidden_size":32', '"hidden_size":-32')), "--out", "x.json"], "model.json: hidden_size=-32 must be > 0"),
        (lambda t, tr: ["profile", TINY, "--micro-batch-size", "-2", "--out", "x.json"], "profile: argument --micro-batch-size: '-2' is not a whole number in [1, 65,536]"),
        (lambda t, tr: ["inspect", str(tr), "--model", "gpt-13b"], "model: trace was taken for tiny"),
        (lambda t, tr: ["inspect", str(t / "missing.json")], "missing.json: file not found"),
        (lambda t, tr: ["import", "aicb", str(t / "missing.txt"), "--out", "x.json"], "missing.txt: file not found"),
        (lambda t, tr: ["profile", "gpt-9000", "--out", "x.json"], "gpt-9000: not a file and not a built-in model"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, tiny_trace, make_args, needle):
    res = run(*make_args(tmp_path, tiny_trace[0]), cwd=tmp_path)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mindpipe: error: ")
    assert needle in lines[0]
    assert res.stdout == ""


def test_usage_errors_exit_2():
    res = run("profile")
    assert res.returncode == 2 and "Traceback" not in res.stderr


def test_profile_at_op_granularity_then_simulate_a_cut_inside_a_block(tmp_path):
    """``profile --granularity op`` → ``simulate --trace`` with a plan cut after a block's attention."""
    trace = tmp_path / "op.json"
    res = run("profile", TINY, "--granularity", "op", "--micro-batch-size", "2", "--warmup", "0", "--repeats", "1",
              "--out", str(trace), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["granularity"] == "op"
    results = {}
    for cuts in (["between_blocks"], ["after_attention"]):
        plan = json.dumps({"pp": 2, "micro_batch_size": 2, "global_batch_size": 4, "precision": "fp32",
                           "stage_cuts": cuts})
        res = run("simulate", "--model", TINY, "--cluster", "cpu:1x2", "--plan", plan, "--trace", str(trace), "--json")
        assert res.returncode == 0, res.stderr
        results[cuts[0]] = json.loads(res.stdout)
    whole, cut = results["between_blocks"], results["after_attention"]
    assert whole["extra"]["compute_model"] == cut["extra"]["compute_model"] == "TraceComputeModel"
    # The first stage gives block 1's MLP (activations and parameters) to the second.
    assert cut["memory_by_stage_gib"][0] < whole["memory_by_stage_gib"][0]
    assert cut["extra"]["params_per_device_by_rank"][0] < whole["extra"]["params_per_device_by_rank"][0]
    bad = run("simulate", "--model", TINY, "--cluster", "cpu:1x2", "--trace", str(trace),
              "--plan", '{"pp": 2, "global_batch_size": 4, "stage_cuts": ["after_mlp"]}')
    assert bad.returncode == 2 and "stage_cuts[0]='after_mlp' is not one of" in bad.stderr


@pytest.mark.parametrize(("host", "precision", "cluster", "noted"), [
    (False, "bf16", "cpu:1x2", True), (False, "fp32", "cpu:1x2", False), (True, "bf16", "cpu:1x2", False),
    (None, "bf16", "cpu:1x2", False), (False, "bf16", "a100-sxm4-80gb:1x8", False),
])
def test_tune_notes_a_bf16_cpu_plan_on_a_host_that_would_emulate_it(monkeypatch, capsys, host, precision, cluster,
                                                                      noted):
    from mindpipe.executor import precheck

    from mindpipe.cli import tune

    monkeypatch.setattr(precheck, "cpu_has_bf16_gemm", lambda: host)
    tune._note_cpu_bf16(precision, cluster)
    assert (precheck.CPU_BF16_NOTICE in capsys.readouterr().err) is noted
