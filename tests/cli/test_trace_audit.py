"""``simulate --trace`` and ``inspect``: a trace is refused for a model it did not measure, and what it does not
measure of a plan is said in ``extra.warning``; ``inspect --model`` checks a supernet's trace too."""

from __future__ import annotations

import json

import pytest
from mindpipe.traces.data import load_shipped_trace
from mindpipe.traces.schema import to_dict

from mindpipe.cli import main

PLAN = '{"pp":2,"micro_batch_size":4,"global_batch_size":8,"precision":"fp32"}'


def _trace_file(tmp_path, **changes):
    data = to_dict(load_shipped_trace("gpt-mini.cpu"))
    data.update(changes)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    return path


def _simulate(capsys, trace, plan=PLAN, cluster="cpu:1x2"):
    rc = main(["simulate", "--model", "gpt-mini", "--cluster", cluster, "--plan", plan, "--trace", str(trace),
               "--json"])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


def test_a_trace_of_the_plan_itself_has_no_warning(capsys):
    rc, payload, _ = _simulate(capsys, "gpt-mini.cpu")
    assert rc == 0 and payload["extra"]["warning"] is None


def test_a_bf16_plan_priced_from_an_fp32_trace_says_so(capsys):
    rc, payload, _ = _simulate(capsys, "gpt-mini.cpu", plan='{"pp":2,"micro_batch_size":4,"global_batch_size":8}')
    assert rc == 0
    assert "trace profiled in fp32, the plan runs bf16: its times are fp32 times, not rescaled" \
        in payload["extra"]["warning"]
    assert "profile with --dtype bf16" in payload["extra"]["warning"]


def test_an_fp8_plan_priced_from_a_bf16_trace_names_a_way_that_exists(capsys):
    """mindpipe profile has no fp8 dtype: the warning must not send the user to ``--dtype fp8``."""
    rc, payload, _ = _simulate(capsys, "gpt-mini.cpu", plan='{"pp":2,"micro_batch_size":4,"global_batch_size":8,"precision":"fp8"}',
                               cluster="h100-sxm5-80gb:1x2")
    assert rc == 0
    warning = payload["extra"]["warning"]
    assert "the plan runs fp8" in warning and "--dtype fp8" not in warning
    assert "mindpipe profile has no fp8: simulate without --trace" in warning


def test_a_trace_without_its_lm_head_says_the_head_is_free(capsys, tmp_path):
    layers = [r for r in to_dict(load_shipped_trace("gpt-mini.cpu"))["layers"] if r["kind"] != "lm_head"]
    rc, payload, _ = _simulate(capsys, _trace_file(tmp_path, layers=layers))
    assert rc == 0 and payload["extra"]["warning"] == "the trace has no lm_head record: the LM head and loss priced as 0 s"


def test_a_trace_profiled_at_a_shorter_sequence_is_refused(capsys, tmp_path):
    rc, _, err = _simulate(capsys, _trace_file(tmp_path, seq_len=64))
    assert rc == 2 and err.count("\n") == 1
    assert "t.json: seq_len: the trace was profiled at seq_len=64 but gpt-mini runs seq_len=128" in err


def test_inspect_refuses_a_trace_profiled_at_a_shorter_sequence(capsys, tmp_path):
    assert main(["inspect", str(_trace_file(tmp_path, seq_len=64)), "--model", "gpt-mini"]) == 2
    assert "profiled at seq_len=64" in capsys.readouterr().err


@pytest.fixture(scope="module")
def supernet_trace(tmp_path_factory):
    from mindpipe.traces.builtin import load_network
    from mindpipe.traces.profiler import ProfileOptions, profile_supernet

    path = tmp_path_factory.mktemp("sn") / "sn.json"
    profile_supernet(load_network("supernet-mini"), ProfileOptions(warmup=0, repeats=1)).save(path)
    return path


def test_inspect_checks_a_supernet_trace_against_its_supernet(capsys, supernet_trace):
    assert main(["inspect", str(supernet_trace), "--model", "supernet-mini"]) == 0
    out, err = capsys.readouterr()
    assert "supernet-mini" in out and "not checked" not in err
    assert main(["inspect", str(supernet_trace), "--model", "naspipe-c1"]) == 2
    assert "trace was taken for supernet-mini" in capsys.readouterr().err


def test_inspect_refuses_a_supernet_trace_for_a_gpt_model(capsys, supernet_trace):
    assert main(["inspect", str(supernet_trace), "--model", "gpt-mini"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the trace was taken for the supernet supernet-mini, not for gpt-mini" in err


def test_profile_refuses_flash_attention_for_a_supernet(capsys, tmp_path):
    # It was accepted and ignored: the trace said flash_attention=false.
    assert main(["profile", "supernet-mini", "--flash-attention", "--quiet", "--out", str(tmp_path / "sn.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--flash-attention applies to GPT and Llama models" in err
    assert not (tmp_path / "sn.json").exists()


def test_inspect_flags_a_per_layer_sum_far_from_the_step(capsys, tmp_path):
    data = to_dict(load_shipped_trace("gpt-mini.cpu"))
    for r in data["layers"]:  # times written in milliseconds
        r["forward_s"] *= 1000
    path = tmp_path / "ms.json"
    path.write_text(json.dumps(data))
    assert main(["inspect", str(path)]) == 0
    assert "note: the per-layer sum is far from the whole step" in capsys.readouterr().out
    assert main(["inspect", "gpt-mini.cpu"]) == 0
    assert "far from the whole step" not in capsys.readouterr().out
