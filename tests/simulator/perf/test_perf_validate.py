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
from mindpipe.simulator.perf.validate import (
    RowResult,
    error_stats,
    format_report,
    ranking_groups,
    ranking_stats,
    ranking_summary,
    size_label,
    spearman_rho,
    summarize,
    validate_rows,
    with_gpu,
)
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
    assert stats.n == 100 and stats.mape is not None
    assert stats.mape <= 8.0, f"single-node hold-out sample MAPE {stats.mape:.2f}% (7.08% when pinned; 7.09% with the MAMF bound of issue 19)"


@needs_data
def test_multi_node_sample_mape_pinned() -> None:
    stats = error_stats(validate_rows(_sample(MULTI, 20)))
    assert stats.mape is not None
    assert stats.mape <= 10.0, f"multi-node sample MAPE {stats.mape:.2f}% (7.14% when pinned; 6.29% with the MAMF bound of issue 19)"


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



def test_cli_report_is_refused_for_vtrain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --report writes only the measured runs' report: a vTrain run refuses it instead of ignoring it.
    csv = tmp_path / "any.csv"
    csv.write_text("x\n")
    assert main(["validate", "vtrain-single", "--data", str(csv), "--report", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--report writes the fidelity report of 'measured' runs" in err
    assert not (tmp_path / "rep").exists()

@needs_data
def test_cli_wrong_dataset_kind_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "vtrain-multi", "--data", str(_small_csv(tmp_path))]) == 2
    assert "single-node" in capsys.readouterr().err


# -- ranking metrics (issue 19, deliverable 4) ------------------------------------------------------


def _rr(measured: float, predicted: float, size: str = "g", gpus: int = 8, gbs: int = 64, tp: int = 1,
        source: str = "") -> RowResult:
    return RowResult(source or f"f.csv:{measured}-{predicted}", size, gpus, tp, 1, gpus // tp, 1, gbs, measured, predicted)


def test_spearman_rho_perfect_reversed_and_ties() -> None:
    assert spearman_rho([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman_rho([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # Ties take the mean of the ranks they span: x ranks (1.5, 1.5, 3), y ranks (1, 2, 3).
    assert spearman_rho([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254, abs=1e-6)
    # Monotone but not linear: rank correlation is still 1.
    assert spearman_rho([1, 2, 3], [1, 100, 101]) == pytest.approx(1.0)


def test_spearman_rho_undefined_cases() -> None:
    assert spearman_rho([], []) is None
    assert spearman_rho([3.0], [1.0]) is None  # one pair
    assert spearman_rho([2, 2, 2], [1, 2, 3]) is None  # a constant side
    with pytest.raises(ValueError):
        spearman_rho([1, 2], [1])


def test_ranking_stats_regret_of_predicted_best() -> None:
    rows = [_rr(10.0, 5.0), _rr(8.0, 6.0), _rr(9.0, 7.0)]
    st = ranking_stats(rows)
    # The simulator ranks the 10 s plan first; the best measured is 8 s: regret 10/8 - 1 = 25 %.
    assert st.n == 3 and st.regret_pct == pytest.approx(25.0)
    assert st.predicted_best is not None and st.measured_best is not None
    assert st.predicted_best.measured_s == 10.0 and st.measured_best.measured_s == 8.0
    assert st.spearman_rho == pytest.approx(-0.5)


def test_ranking_stats_tie_for_first_counts_the_slowest() -> None:
    rows = [_rr(8.0, 5.0), _rr(12.0, 5.0), _rr(9.0, 6.0)]
    assert ranking_stats(rows).regret_pct == pytest.approx(50.0)


def test_ranking_stats_single_row_and_empty() -> None:
    st = ranking_stats([_rr(3.0, 2.0)])
    assert st.n == 1 and st.spearman_rho is None and st.regret_pct == 0.0
    assert ranking_stats([]).regret_pct is None


def test_ranking_groups_split_by_model_gpus_and_batch() -> None:
    rows = [_rr(1.0, 1.0, "a", 8, 64), _rr(2.0, 2.0, "a", 8, 64), _rr(3.0, 1.0, "a", 8, 128), _rr(4.0, 4.0, "b", 4, 64)]
    groups = ranking_groups(rows)
    assert [(g.size, g.gpus, g.global_batch, g.stats.n) for g in groups] == [
        ("a", 8, 64, 2), ("a", 8, 128, 1), ("b", 4, 64, 1)]
    summ = ranking_summary(groups)
    # Only groups with at least two rows are ranked.
    assert summ.groups == 1 and summ.min_spearman_rho == pytest.approx(1.0) and summ.max_regret_pct == 0.0
    assert summ.groups_rho_at_least_0_9 == 1 and summ.groups_regret_at_most_1pct == 1


def test_summary_and_report_carry_the_ranking() -> None:
    rows = [_rr(10.0, 5.0, tp=2), _rr(8.0, 6.0, tp=4), _rr(9.0, 7.0, tp=8)]
    summ = summarize(rows)
    assert summ.ranking[0].stats.regret_pct == pytest.approx(25.0)
    # The JSON keeps its flat shape: a group's keys beside its size, GPUs and batch.
    flat = summ.to_dict()
    assert flat["ranking"][0]["regret_pct"] == pytest.approx(25.0) and flat["ranking"][0]["predicted_best"]["tp"] == 2
    assert list(flat) == ["n", "mape", "max_abs_pct_error", "median_signed_pct_error", "by_model_size", "by_layout",
                          "ranking", "ranking_summary"]
    text = format_report("demo", rows, summ, rows_shown=False)
    assert "Spearman" in text and "regret" in text and "25.0%" in text and "tp2 pp1 dp4 mb1" in text
    # The error per layout, in tp order: tp2 −50 %, tp4 −25 %, tp8 −22.2 % (predicted below measured).
    assert list(flat["by_layout"]) == ["tp2 pp1", "tp4 pp1", "tp8 pp1"]
    assert [round(v["mape"], 1) for v in flat["by_layout"].values()] == [50.0, 25.0, 22.2]
    assert "layout" in text and "tp4 pp1" in text


@needs_data
def test_cli_json_has_ranking(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "vtrain-single", "--data", str(_small_csv(tmp_path, 6)), "--json", "--quiet"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert {"ranking", "ranking_summary"} <= set(obj)
    g = obj["ranking"][0]
    assert {"size", "gpus", "global_batch", "n", "spearman_rho", "regret_pct", "predicted_best", "measured_best"} <= set(g)


def test_report_of_one_row_and_one_group_is_in_the_singular() -> None:
    text = format_report("demo", [_rr(10.0, 9.0)], summarize([_rr(10.0, 9.0)]), rows_shown=False)
    assert "demo: 1 row, MAPE" in text and "1 rows" not in text
    two = [_rr(10.0, 5.0, tp=2), _rr(8.0, 6.0, tp=4)]
    assert "  1 group: Spearman" in format_report("demo", two, summarize(two), rows_shown=False)
