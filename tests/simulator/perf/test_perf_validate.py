"""``mindpipe validate``: a seeded sample of vTrain's rows within a pinned error, and the CLI contract.

The full figures (all 1,549 rows, fit and hold-out halves) are in
``benchmarks/results/validate_vtrain.json`` (``benchmarks/validate_vtrain.py``); here a sample
keeps the test to seconds. The bounds are the issue's acceptance targets (8 % single node, 10 % multi
node); the sample's own figure when the bound was pinned is in each assert's message.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from mindpipe.simulator.perf.validate import error_stats, size_label, validate_rows, with_gpu
from mindpipe.simulator.perf.vtrain import load_vtrain, split_fit_holdout
from mindpipe.traces.builtin import load_cluster

from mindpipe.cli import main

DATA = Path(__file__).resolve().parents[4] / "shared" / "data" / "validation"
SINGLE = DATA / "vtrain_a100_single_node.csv"
MULTI = DATA / "vtrain_a100_multi_node.csv"
needs_data = pytest.mark.skipif(not SINGLE.exists() or not MULTI.exists(), reason="shared vTrain data not present")


def _sample(path: Path, n: int, seed: int = 0) -> list:
    return random.Random(seed).sample(load_vtrain(path), n)


@needs_data
def test_single_node_sample_mape_pinned() -> None:
    rows = load_vtrain(SINGLE)
    _fit, hold = split_fit_holdout(rows, seed=0)
    # Only hold-out rows: the shipped constants never saw them (simulator/perf/refit.py).
    sample = random.Random(0).sample(hold, 100)
    stats = error_stats(validate_rows(sample))
    assert stats["n"] == 100
    assert stats["mape"] <= 8.0, f"single-node hold-out sample MAPE {stats['mape']:.2f}% (7.08% when pinned)"


@needs_data
def test_multi_node_sample_mape_pinned() -> None:
    stats = error_stats(validate_rows(_sample(MULTI, 20)))
    assert stats["mape"] <= 10.0, f"multi-node sample MAPE {stats['mape']:.2f}% (7.14% when pinned)"


@needs_data
def test_h100_faster_than_a100_on_same_runs() -> None:
    rows = _sample(MULTI, 3, seed=1)
    a100 = validate_rows(rows)
    h100 = validate_rows([with_gpu(r, "h100-sxm5-80gb") for r in rows])
    for a, h in zip(a100, h100, strict=True):
        # H100 SXM has 3.2x the dense fp16 FLOP/s and 1.7x the HBM bandwidth of an A100 80 GB.
        assert 1.2 < a.predicted_s / h.predicted_s < 3.2


def test_builtin_cluster_entry_describes_vtrain_machines() -> None:
    c = load_cluster("vtrain-a100:8x8")
    assert (c.gpu, c.num_nodes, c.gpus_per_node, c.inter_node_bandwidth_Gbps) == ("a100-sxm4-80gb", 8, 8, 800.0)
    assert load_cluster("vtrain-a100").num_nodes == 1


@needs_data
def test_size_labels() -> None:
    assert size_label(load_vtrain(MULTI)[0]) == "3.6B"
    assert size_label(load_vtrain(SINGLE)[0]).startswith("h1024-L24")


def _small_csv(tmp_path: Path, n: int = 4) -> Path:
    lines = SINGLE.read_text().splitlines()
    path = tmp_path / "small.csv"
    path.write_text("\n".join(lines[: n + 1]) + "\n")
    return path


@needs_data
def test_cli_json_has_summary_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "vtrain-single", "--data", str(_small_csv(tmp_path)), "--json", "--quiet"]) == 0
    out = capsys.readouterr().out
    obj = json.loads(out)
    assert out.count("\n") == 1
    assert {"mape", "max_abs_pct_error", "n", "by_model_size", "rows"} <= set(obj)
    assert obj["n"] == 4 and len(obj["rows"]) == 4


@needs_data
def test_cli_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "vtrain-single", "--data", str(_small_csv(tmp_path, 2))]) == 0
    cap = capsys.readouterr()
    assert "MAPE" in cap.out and "model size" in cap.out and "simulated 2/2" in cap.err


def test_cli_missing_file_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "vtrain-single", "--data", str(tmp_path / "nope.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mindpipe: error:") and err.count("\n") == 1 and "nope.csv" in err


def test_cli_bad_csv_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,c\n1,2,3\n")
    assert main(["validate", "vtrain-single", "--data", str(bad), "--json"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and "header" in cap.err


@needs_data
def test_cli_wrong_dataset_kind_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "vtrain-multi", "--data", str(_small_csv(tmp_path))]) == 2
    assert "single-node" in capsys.readouterr().err
