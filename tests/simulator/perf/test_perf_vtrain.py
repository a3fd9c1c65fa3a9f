"""vTrain loader on the real CSVs, errors that name file and line, the fit/hold-out split."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mindpipe.simulator.perf.vtrain import COLUMNS, load_vtrain, padded_vocab, split_fit_holdout
from mindpipe.traces.config import check_plan
from mindpipe.traces.errors import ContractError

SINGLE = "validation/vtrain_a100_single_node.csv"
MULTI = "validation/vtrain_a100_multi_node.csv"


def test_single_node_rows(shared_data: Path) -> None:
    rows = load_vtrain(shared_data / SINGLE)
    assert len(rows) == 1440
    first = rows[0]  # 2,16,8,1024,16,24,1024,1,1,2,372.160408
    assert (first.model.hidden_size, first.model.num_heads, first.model.num_layers, first.model.seq_len) == (1024, 16, 24, 1024)
    assert first.model.vocab_size == 50304 and first.model.dropout == 0.1
    p = first.plan
    assert (p.tp, p.dp, p.pp, p.micro_batch_size, p.global_batch_size) == (1, 1, 2, 8, 16)
    assert (p.schedule, p.recompute, p.precision, p.overlap_grad_reduce) == ("1f1b", "full", "fp16", False)
    assert p.blocking_p2p  # Megatron waits on its pipeline sends
    assert p.dp_impl == "megatron"  # and reduces its gradients in one contiguous buffer, in place
    assert (first.cluster.num_nodes, first.cluster.gpus_per_node, first.cluster.gpu) == (1, 2, "a100-sxm4-80gb")
    assert first.measured_iteration_time_s == pytest.approx(0.372160408)
    assert first.source.endswith("vtrain_a100_single_node.csv:2") and first.stated_params_billion is None
    for r in rows:
        check_plan(r.plan, r.model, r.cluster)
        if r.plan.num_microbatches < r.plan.pp:
            assert r.plan.schedule == "gpipe"  # Megatron's 1F1B degenerates to GPipe there
    assert sum(r.plan.schedule == "gpipe" for r in rows) == 96
    assert {r.cluster.world_size for r in rows} == {2, 4, 8}


def test_multi_node_rows(shared_data: Path) -> None:
    rows = load_vtrain(shared_data / MULTI)
    assert len(rows) == 109
    assert {r.cluster.num_nodes for r in rows} == {8, 32, 64}
    for r in rows:
        assert r.cluster.gpus_per_node == 8 and r.cluster.inter_node_bandwidth_Gbps == 800
        assert r.model.seq_len == 2048 and r.plan.schedule == "1f1b"
        # Our GPT parameter count agrees with the file's stated size.
        assert r.stated_params_billion is not None
        assert abs(r.model.param_count() / 1e9 / r.stated_params_billion - 1) < 0.04, r.source


def test_megatron_vocabulary_padding() -> None:
    assert [padded_vocab(50257, t) for t in (1, 2, 4, 8, 16)] == [50304, 50432, 50688, 51200, 51200]


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([",".join(COLUMNS), *lines]) + "\n")
    return path


def test_errors_name_the_file_and_line(tmp_path: Path) -> None:
    good = "2,16,8,1024,16,24,1024,1,1,2,372.1"
    path = _write(tmp_path, [good, "2,16,8,1024,16,24,1024,1,2,2,372.1"])
    with pytest.raises(ContractError, match=r"runs\.csv:3: # GPUs: tp×dp×pp=1×2×2 does not equal # GPUs=2"):
        load_vtrain(path)
    path = _write(tmp_path, [good, "2,16,8,1024,16,24,1024,1,1,2,fast"])
    with pytest.raises(ContractError, match=r"runs\.csv:3: iteration time \(ms\)"):
        load_vtrain(path)
    path = _write(tmp_path, ["2,16,8,1024,12,24,1024,1,1,2,300"])
    with pytest.raises(ContractError, match=r"runs\.csv:2.*num_heads"):
        load_vtrain(path)
    path = tmp_path / "bad_header.csv"
    path.write_text("gpus,batch\n2,16\n")
    with pytest.raises(ContractError, match=r"bad_header\.csv: line 1: header must be"):
        load_vtrain(path)


def test_split_is_deterministic_disjoint_and_at_most_half(shared_data: Path) -> None:
    rows = load_vtrain(shared_data / MULTI)
    fit, hold = split_fit_holdout(rows, seed=0)
    again, _ = split_fit_holdout(rows, seed=0)
    other, _ = split_fit_holdout(rows, seed=1)
    assert [r.source for r in fit] == [r.source for r in again]
    assert [r.source for r in fit] != [r.source for r in other]
    assert len(fit) == 54 and len(hold) == 55
    assert not {r.source for r in fit} & {r.source for r in hold}
    with pytest.raises(ContractError, match="fit_fraction"):
        split_fit_holdout(rows, fit_fraction=0.6)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), seed=st.integers(0, 2**32 - 1), frac=st.floats(0.01, 0.5))
def test_split_partitions_any_sequence(n: int, seed: int, frac: float) -> None:
    items = list(range(n))
    fit, hold = split_fit_holdout(items, seed=seed, fit_fraction=frac)
    assert sorted(fit + hold) == items
    assert fit == sorted(fit) and hold == sorted(hold)  # original order kept
    assert len(fit) == int(n * frac) <= n // 2
