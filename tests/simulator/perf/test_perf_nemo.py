"""NeMo 24.07 H100 FP8 table: the loader, the architectures, the fit/hold-out split and ``validate nemo-h100``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mindpipe.simulator.perf.constants import read_constants
from mindpipe.simulator.perf.fp8 import FP8_KEY
from mindpipe.simulator.perf.nemo import COLUMNS, load_nemo, nemo_models, nemo_plan
from mindpipe.simulator.perf.nemo_validate import nemo_report, nemo_split
from mindpipe.traces.errors import ContractError
from mindpipe.traces.what_if import what_if_used

from mindpipe.cli import main

CSV = Path(__file__).resolve().parents[4] / "shared" / "data" / "validation" / "nemo_2407_h100_fp8.csv"
needs_data = pytest.mark.skipif(not CSV.exists(), reason="shared NeMo data not present")
HEAD = ",".join(COLUMNS)
GPT3_5B = "GPT3-5B,64,2048,4,2048,1,1,1,1,22521,736"


def _csv(tmp_path: Path, *rows: str, head: str = HEAD) -> Path:
    p = tmp_path / "nemo.csv"
    p.write_text("\n".join([head, *rows]) + "\n")
    return p


def test_iteration_time_is_derived_from_tokens_per_second(tmp_path: Path) -> None:
    (row,) = load_nemo(_csv(tmp_path, GPT3_5B))
    assert row.measured_iteration_time_s == pytest.approx(2048 * 2048 / (22521 * 64))
    p = row.plan
    assert p is not None and (p.dp, p.tp, p.pp, p.precision, p.zero_stage) == (64, 1, 1, "fp8", 1)
    assert row.model.vocab_size == 50304  # GPT-2's 50,257 padded to a multiple of 128 (Megatron)


def test_interleaved_and_context_parallel_rows(tmp_path: Path) -> None:
    rows = load_nemo(_csv(tmp_path, "GPT3-175B,128,256,1,2048,4,8,1,6,726,782", "LLAMA3-8B,8,128,1,8192,1,1,2,1,12036,697"))
    p = rows[0].plan
    assert p is not None and (p.schedule, p.virtual_stages, p.sequence_parallel, p.dp) == ("interleaved_1f1b", 6, True, 4)
    q = rows[1].plan
    assert rows[1].cp == 2 and (q.cp, q.dp, q.tp, q.pp, q.flash_attention) == (2, 4, 1, 1, True)
    assert q.world_size == 8


@pytest.mark.parametrize(("row", "head", "match"), [
    (GPT3_5B, HEAD.replace(",vp", ""), "line 1: header must be"),
    ("GPT3-5B,64,2048,4,2048,1,1,1,1,nan,736", HEAD, r":2: tokens_per_s_per_gpu: 'nan' is not a finite number"),
    ("GPT3-5B,64,2048,4,2048,1,1,1,1,inf,736", HEAD, "is not a finite number"),
    ("GPT3-5B,64,2048,4,2048,1,1,1,1,22521,1e400", HEAD, r"model_tflops_per_gpu: '1e400' is not a finite number"),
    ("GPT3-5B,64,2048,4,2048,1,1,1,1,0,736", HEAD, "tokens_per_s_per_gpu=0 must be > 0"),
    ("GPT3-6B,64,2048,4,2048,1,1,1,1,22521,736", HEAD, "unknown model 'GPT3-6B'"),
    ("GPT3-5B,60,2048,4,2048,1,1,1,1,22521,736", HEAD, r"gpus=60 does not fill whole 8-GPU"),
    ("GPT3-5B,64,2048,4,2048,3,1,1,1,22521,736", HEAD, r"tp×pp×cp=3×1×1 does not divide gpus=64"),
    ("GPT3-5B,64,2048,4,2048,1,1,1,2.5,22521,736", HEAD, "vp: '2.5' is not a whole number"),
    ("GPT3-5B,64,2048", HEAD, "expected 11 fields, got 3"),
])
def test_bad_rows_are_one_line_errors(tmp_path: Path, row: str, head: str, match: str) -> None:
    with pytest.raises(ContractError, match=match):
        load_nemo(_csv(tmp_path, row, head=head))


def test_header_only_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match="no data rows"):
        load_nemo(_csv(tmp_path))
    (tmp_path / "e.csv").write_text("")
    with pytest.raises(ContractError, match="empty file"):
        load_nemo(tmp_path / "e.csv")


@pytest.mark.parametrize(("name", "billions"), [("GPT3-5B", 5), ("GPT3-20B", 20), ("GPT3-175B", 175),
                                                ("LLAMA2-7B", 6.7), ("LLAMA2-13B", 13), ("LLAMA2-70B", 69),
                                                ("LLAMA3-8B", 8), ("LLAMA3-70B", 70.6), ("Nemotron-8B", 8.5),
                                                ("Nemotron-22B", 22), ("Nemotron-340B", 341)])
def test_architectures_have_their_nominal_size(name: str, billions: float) -> None:
    m = nemo_models()[name]
    assert m.source.startswith("NVIDIA/NeMo ")
    assert m.model.param_count() / 1e9 == pytest.approx(billions, rel=0.08)


@needs_data
def test_split_fits_on_at_most_half_and_holds_the_cp_rows_out() -> None:
    rows = load_nemo(CSV)
    fit, hold = nemo_split(rows)
    assert len(rows) == 12 and len(fit) == 5 and len(hold) == 7
    assert not {r.source for r in fit} & {r.source for r in hold}
    assert all(r.cp == 1 for r in fit) and {r.name for r in hold if r.cp > 1} == {"LLAMA3-8B", "LLAMA3-70B"}


@needs_data
def test_report_matches_the_shipped_fit_record() -> None:
    """The shipped fp8.json's hold-out MAPE is what the command reports (re-fit when the model changes)."""
    report = nemo_report(load_nemo(CSV))
    record = read_constants(shipped="fp8.json").records[FP8_KEY]
    s = report.summary
    assert s.overall.n == 12 and len(report.rows) == 12
    assert s.fit_half is not None and s.holdout_half is not None
    assert s.fit_half.n + s.holdout_half.n == 12
    assert sum(r.half == "fit" for r in report.rows) == s.fit_half.n
    if record.method == "fit":
        assert s.holdout_half.mape == pytest.approx(record.holdout_mape_percent, abs=0.01)


@needs_data
def test_a_part_of_the_table_keeps_the_whole_tables_halves() -> None:
    # From Python, a report on some rows labels them as the shipped fit did when given the whole
    # table; a split drawn from the part alone labelled rows "fit" that fp8_gemm_efficiency never saw.
    rows = load_nemo(CSV)
    whole = {r.result.source: r.half for r in nemo_report(rows).rows}
    part = nemo_report(rows[:4], table=rows)
    assert [r.half for r in part.rows] == [whole[r.result.source] for r in part.rows]
    assert [r.half for r in part.rows] == ["holdout", "fit", "holdout", "fit"]

@needs_data
def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "nemo-h100", "--data", str(CSV), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dataset"] == "nemo-h100" and out["precision"] == "fp8" and out["n"] == 12
    assert {r["model"] for r in out["rows"] if r["cp"] == 2} == {"LLAMA3-8B", "LLAMA3-70B"}
    assert {r["half"] for r in out["rows"] if r["cp"] == 2} == {"holdout"}
    assert {r["half"] for r in out["rows"]} == {"fit", "holdout"}


def test_cli_refuses_other_datasets_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(_csv(tmp_path, GPT3_5B))
    assert main(["validate", "nemo-h100", "--data", path, "--sample", "3"]) == 2
    assert "--sample does not apply to nemo-h100" in capsys.readouterr().err


def test_recipes_come_from_the_launcher_configs_and_reach_the_plans(tmp_path: Path) -> None:
    """Per model, NeMo's recipe (nemo_models.json ``recipe``) sets TP overlap and recompute; every row
    overlaps the distributed optimizer's all-gather; tp 1 rows have nothing to overlap."""
    for m in nemo_models().values():
        assert "NeMo-Framework-Launcher" in m.recipe.evidence or "cp 2" in m.recipe.evidence
    rows = load_nemo(_csv(tmp_path, GPT3_5B, "GPT3-20B,64,256,2,2048,2,1,1,1,5851,750",
                          "Nemotron-340B,128,32,1,4096,8,8,1,12,322,678"))
    plans = [r.plan for r in rows]
    assert all(p is not None and p.overlap_param_gather and p.zero_stage == 1 for p in plans)
    five, twenty, big = plans
    assert five is not None and twenty is not None and big is not None
    assert (five.tp_comm_overlap, five.recompute) == (False, "none")
    assert (twenty.tp_comm_overlap, twenty.sequence_parallel, twenty.recompute) == (True, True, "selective")
    assert (big.tp_comm_overlap, big.recompute) == (True, "none")
    assert set(what_if_used(big)) == {"overlap_grad_reduce", "tp_comm_overlap", "overlap_param_gather", "fused_elementwise",
                                       "dp_impl"}
    assert all(p.fused_elementwise for p in plans)  # Transformer Engine's fused norm, rotary and SwiGLU kernels
    assert all(p.dp_impl == "megatron" for p in plans)  # Megatron-core DDP: in-place buffers, no FSDP2 copies
    # vp > 1: Megatron-core's interleaved schedule with overlap_p2p_comm leaves sends in flight; a
    # 1F1B pipeline (vp = 1) blocks on them; no pipeline, nothing to send.
    assert not big.blocking_p2p and not five.blocking_p2p
    assert nemo_plan(64, 256, 1, 2, 4, 1).blocking_p2p and not nemo_plan(64, 256, 1, 2, 4, 2).blocking_p2p
