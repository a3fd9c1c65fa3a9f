"""The torch supernet: contract parameter counts, causality, per-candidate seeding, frozen shared parts; its profile."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mindpipe.traces.builtin import load_supernet
from mindpipe.traces.errors import ContractError
from mindpipe.traces.profiler import ProfileOptions, profile_supernet
from mindpipe.traces.schema import from_dict, to_dict
from mindpipe.traces.supernet import Supernet
from mindpipe.traces.torch_supernet import CandidateBlock, SupernetStage, build_supernet_stages
from mindpipe.traces.trace import Trace

MINI = load_supernet("supernet-mini")
ALL_KINDS = from_dict(Supernet, {
    "kind": "supernet", "num_layers": 2, "hidden_size": 16, "seq_len": 12, "vocab_size": 40,
    "candidates": [
        {"name": "attn4", "op": "attention", "num_heads": 4},
        {"name": "ffn24", "op": "ffn", "ffn_hidden_size": 24},
        {"name": "conv3", "op": "conv", "kernel_size": 3, "conv_type": "standard"},
        {"name": "sep5", "op": "conv", "kernel_size": 5, "conv_type": "separable"},
        {"name": "lw7r4", "op": "conv", "kernel_size": 7, "conv_type": "lightweight", "conv_heads": 4},
    ]})


@pytest.mark.parametrize("k", range(len(ALL_KINDS.candidates)))
def test_candidate_matches_contract_param_count_and_is_causal(k: int) -> None:
    cand = ALL_KINDS.candidates[k]
    torch.manual_seed(k)
    block = CandidateBlock(ALL_KINDS, cand)
    assert sum(p.numel() for p in block.parameters()) == cand.param_count(ALL_KINDS.hidden_size)
    x = torch.randn(2, ALL_KINDS.seq_len, ALL_KINDS.hidden_size)
    y = block(x)
    assert y.shape == x.shape
    x2 = x.clone()
    x2[:, 7] += 1.0  # a change at position 7 must not reach positions 0..6
    y2 = block(x2)
    assert torch.equal(y[:, :7], y2[:, :7])
    assert not torch.equal(y[:, 7:], y2[:, 7:])


def test_a_stage_built_alone_equals_the_same_layers_of_a_whole_build() -> None:
    whole = build_supernet_stages(MINI, [3, 5], seed=4)
    alone = SupernetStage(MINI, 3, 5, first=False, last=True, seed=4)
    a, b = whole[1].state_dict(), alone.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[key], b[key]) for key in a)
    other = SupernetStage(MINI, 3, 5, first=False, last=True, seed=5)
    assert not torch.equal(other.state_dict()["candidates.L3_0.op.qkv.weight"], b["candidates.L3_0.op.qkv.weight"])
    # Candidates of one layer draw from distinct streams (same shapes, different values).
    assert not torch.equal(b["candidates.L3_0.op.qkv.weight"], b["candidates.L3_1.op.qkv.weight"])


def test_shared_parts_are_frozen_unless_train_shared() -> None:
    frozen = build_supernet_stages(MINI, [8], seed=0)[0]
    assert frozen.embedding is not None and frozen.head is not None
    assert not any(p.requires_grad for p in (*frozen.embedding.parameters(), *frozen.head.parameters()))
    assert all(p.requires_grad for p in frozen.candidates.parameters())
    choices = (0, 1, 2, 3, 4, 5, 0, 1)
    assert frozen.chosen(choices) == [frozen.block(i, k) for i, k in enumerate(choices)]
    trained = from_dict(Supernet, {**to_dict(MINI), "train_shared": True})
    stage = build_supernet_stages(trained, [8], seed=0)[0]
    assert all(p.requires_grad for p in stage.parameters())
    assert stage.embedding in stage.chosen(choices) and stage.head in stage.chosen(choices)


def test_profile_supernet_records_every_candidate(tmp_path: Path) -> None:
    opts = ProfileOptions(micro_batch_size=2, warmup=0, repeats=1, step_repeats=0)
    trace = profile_supernet(MINI, opts, command="test")
    assert trace.granularity == "candidate" and trace.supernet == MINI
    assert [r.name for r in trace.layers] == ["embedding", *[f"candidate.{c.name}" for c in MINI.candidates], "head"]
    by = {r.name: r for r in trace.layers}
    for c in MINI.candidates:
        r = by[f"candidate.{c.name}"]
        assert r.kind == c.op and r.param_count == c.param_count(MINI.hidden_size)
        assert r.forward_s > 0 and r.forward_flops is not None and r.activation_bytes
        assert r.output_bytes == 2 * MINI.seq_len * MINI.hidden_size * 4
    assert by["embedding"].backward_weight_s == 0 and by["head"].backward_weight_s == 0  # frozen
    trace.save(tmp_path / "t.json")
    assert Trace.load(tmp_path / "t.json").supernet == MINI


def test_candidate_granularity_needs_the_supernet() -> None:
    opts = ProfileOptions(micro_batch_size=1, warmup=0, repeats=1)
    trace = profile_supernet(MINI, opts, command="test")
    doc = dict(to_dict(trace))
    doc.pop("supernet")
    with pytest.raises(ContractError, match="supernet"):
        Trace.from_dict(doc)


def test_cli_profiles_a_builtin_supernet(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = tmp_path / "trace.json"
    res = subprocess.run([sys.executable, "-m", "mindpipe.cli", "profile", "supernet-mini", "--device", "cpu",
                          "--warmup", "0", "--repeats", "1", "--quiet", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    trace = Trace.load(out)
    assert trace.granularity == "candidate" and trace.supernet is not None and trace.supernet.name == "supernet-mini"
    assert len(trace.layers) == len(MINI.candidates) + 2
    bad = subprocess.run([sys.executable, "-m", "mindpipe.cli", "profile", "supernet-mini", "--granularity", "op",
                          "--out", str(tmp_path / "x.json")], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "granularity" in bad.stderr


def test_inspect_prices_a_mean_subnet_not_the_sum_of_every_candidate() -> None:
    from mindpipe.traces.summary import format_summary, summarize

    opts = ProfileOptions(micro_batch_size=1, warmup=0, repeats=1, step_repeats=0)
    names = [c.name for c in MINI.candidates]
    split = from_dict(Supernet, {**to_dict(MINI), "layer_candidates": [names[:2]] * 4 + [names[2:]] * 4})
    trace = profile_supernet(split, opts, command="test")
    t = {r.name: r.forward_s + r.backward_input_s + r.backward_weight_s for r in trace.layers}
    lower = sum(t[f"candidate.{n}"] for n in names[:2]) / 2
    upper = sum(t[f"candidate.{n}"] for n in names[2:]) / 4
    s = summarize(trace)
    assert s.mean_subnet_forward_backward_s == pytest.approx(t["embedding"] + 4 * lower + 4 * upper + t["head"])
    assert s.forward_backward_s == pytest.approx(sum(t.values()))
    text = format_summary(trace)
    assert "every candidate once, no subnet's step" in text and "a mean subnet (embedding, one candidate in each of 8" in text
    assert "sum of per-layer" not in text
    assert "mean_subnet_forward_backward_s" in s.to_dict()
