"""The headed-CSV reader (``traces.reading.read_headed_csv``) on real-world variants of
the published validation tables: the same columns in another order, and a header that differs.

Cells are returned by column name, so a file whose header holds exactly the expected columns in
another order (as a spreadsheet or ``pandas.to_csv`` may write it) reads the same rows.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from mindpipe.simulator.perf.nemo import load_nemo
from mindpipe.simulator.perf.vtrain import load_vtrain
from mindpipe.traces.errors import ContractError

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "validation"
NEMO, SINGLE = DATA / "nemo_2407_h100_fp8.csv", DATA / "vtrain_a100_single_node.csv"
needs_data = pytest.mark.skipif(not NEMO.exists() or not SINGLE.exists(), reason="../shared/data not present")


def _rewrite(src: Path, dst: Path, columns: list[int] | None = None, extra: str | None = None) -> Path:
    rows = list(csv.reader(src.read_text().splitlines()))
    order = columns if columns is not None else list(range(len(rows[0])))
    with dst.open("w", newline="") as f:
        w = csv.writer(f)
        for i, r in enumerate(rows):
            w.writerow([r[j] for j in order] + ([] if extra is None else [extra if i == 0 else "x"]))
    return dst


def _same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        fields = [k for k in vars(x) if k != "source"]
        assert [getattr(x, k) for k in fields] == [getattr(y, k) for k in fields]


@needs_data
def test_nemo_columns_in_another_order_read_the_same_rows(tmp_path: Path) -> None:
    n = len(NEMO.read_text().splitlines()[0].split(","))
    _same(load_nemo(_rewrite(NEMO, tmp_path / "n.csv", list(reversed(range(n))))), load_nemo(NEMO))


@needs_data
def test_vtrain_columns_in_another_order_read_the_same_rows(tmp_path: Path) -> None:
    n = len(SINGLE.read_text().splitlines()[0].split(","))
    order = [n - 1, *range(n - 1)]  # the measured time first
    _same(load_vtrain(_rewrite(SINGLE, tmp_path / "v.csv", order)), load_vtrain(SINGLE))


@needs_data
def test_vtrain_multi_node_columns_in_another_order_read_the_same_rows(tmp_path: Path) -> None:
    multi = DATA / "vtrain_a100_multi_node.csv"
    n = len(multi.read_text().splitlines()[0].split(","))
    order = [*range(1, n), 0]  # "Parameters (billion)" last, not first
    _same(load_vtrain(_rewrite(multi, tmp_path / "m.csv", order)), load_vtrain(multi))


@needs_data
def test_a_header_that_differs_names_the_columns(tmp_path: Path) -> None:
    path = _rewrite(NEMO, tmp_path / "extra.csv", extra="notes")
    with pytest.raises(ContractError) as err:
        load_nemo(path)
    assert str(err.value).count("\n") == 0
    assert "header must be: model,gpus," in str(err.value) and "unexpected column 'notes'" in str(err.value)
    n = len(NEMO.read_text().splitlines()[0].split(","))
    path = _rewrite(NEMO, tmp_path / "missing.csv", list(range(n - 1)))  # model_tflops_per_gpu left out
    with pytest.raises(ContractError, match="missing column 'model_tflops_per_gpu'"):
        load_nemo(path)
