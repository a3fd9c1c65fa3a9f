"""Hostile input through the command line: one line on stderr, exit 2, nothing on stdout, bounded work.

The cases of issue 15 on the input side (each class, not only the examples): argument checks,
limits checked before work starts, strict JSON output, and the loaders' refusals seen from the CLI.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
from mindpipe.simulator.perf.vtrain import COLUMNS

from mindpipe.cli import main
from mindpipe.cli import profile as profile_cli
from mindpipe.cli.output import json_text

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "benchmarks/results/calibration/fit_dp4.r0.json.gz"
SIM = ["simulate", "--model", "gpt-mini", "--cluster", "cpu:1x1", "--plan", "{}"]


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str, rc: int = 2) -> str:
    assert main(argv) == rc
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and cap.err.startswith("mindpipe: error: "), cap.err
    assert needle in cap.err, cap.err
    return cap.err


@pytest.mark.parametrize(("argv", "needle"), [
    (["demo", "--ranks", "2", "--steps", "0"], "demo: argument --steps: '0' is not a whole number in [3, 1,000]"),
    # two steps would leave only the warm-up and the profiled step: nothing timed
    (["demo", "--ranks", "2", "--steps", "2"], "demo: argument --steps: '2' is not a whole number in [3, 1,000]"),
    (["demo", "--global-batch", "3"], "mindpipe: error: --global-batch: 3: the demo's plans need a multiple of 16 samples"),
    (["demo", "--ranks", "0"], "argument --ranks: '0' is not a whole number"),
    (["tune", "--model", "gpt-mini", "--cluster", "cpu:1x2", "--out", "x", "--budget", "10" * 20],
     "argument --budget"),
    (["tune", "--model", "gpt-mini", "--cluster", "cpu:1x2", "--out", "x", "--critical-batch", "nan"],
     "argument --critical-batch: 'nan' is not a finite number"),
    (["tune", "--model", "gpt-mini", "--cluster", "cpu:1x2", "--out", "x", "--seed", str(2**40)], "argument --seed"),
    (["validate", "vtrain-single", "--data", "x.csv", "--sample", "-1"], "argument --sample"),
    (["profile", "gpt-mini", "--out", "x.json", "--repeats", "1e9"], "argument --repeats"),
    (["import", "aicb", "f", "--out", "x.json", "--seq-len", "99999999999"], "argument --seq-len"),
    (["simulate", "--model", "gpt-mini"], "the following arguments are required"),
    ([*SIM, "--gantt", "out.xyz"], "--gantt: 'out.xyz': a Gantt chart is written as .png, .pdf, .svg"),
    ([*SIM, "--start", "2024-01-01T00:00"], "--start: --start is the iteration's start in --carbon-csv's series"),
])
def test_argument_checks(capsys, argv, needle):
    _one_line(capsys, argv, needle)


@pytest.mark.parametrize(("extra", "needle"), [
    (["--fix", 'partition=["a","b"]'], "--fix: partition[0]='a' must be an integer"),
    (["--fix", "partition=[1e400]"], "--fix: partition must be a JSON list, e.g. partition=[4,4] ([0]: 1e400 is not a"),
    (["--fix", "tp=" + "9" * 30], "--fix: tp="),
    (["--global-batch", f"1:{2**4000}"], "--global-batch: '1:"),
    (["--global-batch", "2^40"], "--global-batch: '2^40' is not N, A,B,C or A:B"),
    (["--global-batch", "1:1099511627776"], "with 0 < A <= B <= 16,777,216"),
    (["--global-batch", ",".join(["8"] * 65)], "65 global batch sizes; at most 64 (limit)"),
    (["--constraint", "throughput>=1e400"], "--constraint: throughput: '1e400' is not a finite number"),
])
def test_tune_refuses_at_once(capsys, tmp_path, extra, needle):
    _one_line(capsys, ["tune", "--model", "gpt-mini", "--cluster", "cpu:1x2", "--out", str(tmp_path / "t"),
                       "--budget", "2", "--quiet", *extra], needle)
    assert not (tmp_path / "t").exists()  # refused before any sweep state was written


@pytest.mark.parametrize(("model", "needle"), [
    ({"num_layers": 100_000_000}, "num_layers=100000000 exceeds the limit of 16,384 transformer blocks"),
    ({"num_layers": 1e400}, "num_layers: 1e400 is not a finite number"),
    ({"seq_len": 10**19}, "seq_len: 10000000000000000000 is outside ±2^53"),
    ({"seq_len": 10**30}, "seq_len: 100000000000...(31 characters) has more than 20 digits (limit)"),
])
def test_model_limits_before_work(capsys, model, needle):
    spec = {"kind": "gpt", "num_layers": 4, "hidden_size": 256, "num_heads": 8, "seq_len": 128, "vocab_size": 2048}
    text = json.dumps({**spec, **model}).replace("Infinity", "1e400")
    _one_line(capsys, ["simulate", "--model", text, "--cluster", "cpu:1x1", "--plan", "{}"], needle)


def test_plan_limits_before_work(capsys):
    _one_line(capsys, [*SIM[:-1], '{"global_batch_size": 1048576}'],
              "<inline plan>: global_batch_size: m=1048576 exceeds the limit of 16,384 micro-batches")


def test_validate_refuses_absurd_csv_numbers(capsys, tmp_path):
    path = tmp_path / "v.csv"
    path.write_text(",".join(COLUMNS) + "\n2,16,8,1024,16,1e300,1024,1,1,2,372.16\n")
    _one_line(capsys, ["validate", "vtrain-single", "--data", str(path), "--json"],
              "v.csv:2: # layers: '1e300' is not a whole number in [1, 16384]")


def test_aicb_rows_are_bounded(capsys, tmp_path):
    head = "HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 2\n1\n"
    path = tmp_path / "w.txt"
    path.write_text(head + "l -1 5 NONE 0 5 NONE 0 5 NONE 0 1\n" * 65_537)
    _one_line(capsys, ["import", "aicb", str(path), "--out", str(tmp_path / "o.json")],
              "layers: 65537 layer rows; an AICB workload may have at most 65,536 (limit)")
    path.write_text(head + "l -1 5 NONE 0 5 NONE 0 5 NONE 0 1\n" * 250_000)
    _one_line(capsys, ["import", "aicb", str(path), "--out", str(tmp_path / "o.json")],
              "AICB workload input may be at most 8 MiB (limit)")


def test_torch_profiler_pattern_cannot_backtrack(capsys, tmp_path):
    events = [{"ph": "X", "cat": "user_annotation", "name": "a" * 30 + "!", "pid": 1, "tid": 1, "ts": 0, "dur": 1}]
    (tmp_path / "p.json").write_text(json.dumps({"traceEvents": events}))
    _one_line(capsys, ["import", "torch-profiler", str(tmp_path / "p.json"), "--out", str(tmp_path / "o.json"),
                       "--pattern", "^(a+)+$"], "no layer ranges found with record_function grouping")


def _run_doc() -> dict:
    return json.loads(gzip.decompress(RUN.read_bytes()))


def test_calibrate_refuses_runs_of_two_models(capsys, tmp_path):
    other = _run_doc()
    other["model"].update(num_layers=2, name="other")
    (tmp_path / "other.json").write_text(json.dumps(other))
    err = _one_line(capsys, ["calibrate", str(RUN), str(tmp_path / "other.json"), "--out", str(tmp_path / "c.json")],
                    "calibrate runs of one model at a time")
    assert "other (num_layers=2" in err and "gpt-mini (num_layers=4" in err
    assert not (tmp_path / "c.json").exists()


def test_a_measured_step_of_zero_seconds_is_refused(capsys, tmp_path):
    doc = _run_doc()
    doc["measurement"]["steps"][0]["iteration_s"] = 0
    (tmp_path / "zero.json").write_text(json.dumps(doc))
    for argv in (["calibrate", str(tmp_path / "zero.json"), "--out", str(tmp_path / "c.json")],
                 ["validate", "measured", "--data", str(tmp_path / "zero.json"), "--json"]):
        _one_line(capsys, argv, "zero.json: measurement.steps[0].iteration_s=0.0 must be > 0")


def test_profile_checks_memory_before_building(capsys, monkeypatch):
    monkeypatch.setattr(profile_cli, "available_bytes", lambda device: (8 * 2**30, "this machine has"))
    err = _one_line(capsys, ["profile", "gpt3-175b", "--out", "never.json"], "gpt3-175b: needs about ")
    assert "175,244,992,512 parameters" in err and "this machine has 8.0 GiB available" in err
    need = profile_cli.profile_bytes(profile_cli.loaders.model("gpt-mini"), 1, None, "fp32")
    assert 2 * 4 * 1_000_000 < need < 2**30  # gpt-mini: ~2.4 M parameters, small activations


def test_json_output_is_strict():
    text = json_text({"a": 1.0, "b": [math.inf, {"c": math.nan}], "d": -math.inf})
    assert json.loads(text) == {"a": 1.0, "b": [None, {"c": None}], "d": None,
                                "non_finite": {"b[0]": "inf", "b[1].c": "nan", "d": "-inf"}}
    assert "NaN" not in text and "Infinity" not in text
