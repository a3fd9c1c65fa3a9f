"""Unit tests of the executor's pure pieces: no processes are launched."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from mindpipe.executor.comm_profile import axis_of
from mindpipe.executor.config import RunConfig, add_run_arguments, config_from_args
from mindpipe.executor.data import TokenSource
from mindpipe.executor.distributed import mesh_shape
from mindpipe.executor.launch import _first_error, launch_command, torchrun_command
from mindpipe.executor.precheck import resolve_schedule_source
from mindpipe.executor.rundir import RankError
from mindpipe.executor.stages import block_ranges, build_stage_modules, head_major_qkv, permute_qkv_for_tp
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import rank_stages as local_stages
from mindpipe.traces.torch_gpt import build_gpt

from .conftest import TINY


def test_head_major_qkv_gives_each_tp_rank_its_own_heads():
    # Rows of a fused QKV projection are [q | k | v]; after the permutation, contiguous shard r
    # must hold q, k and v of the heads r owns, so `chunk(3)` on the local output is right.
    h, tp = 8, 2
    rows = torch.arange(3 * h, dtype=torch.float32)  # row i is labelled i
    out = head_major_qkv(rows, tp)
    q, k, v = rows.chunk(3)
    for r, shard in enumerate(out.chunk(tp)):
        lq, lk, lv = shard.chunk(3)
        assert torch.equal(lq, q.chunk(tp)[r]) and torch.equal(lk, k.chunk(tp)[r]) and torch.equal(lv, v.chunk(tp)[r])
    assert torch.equal(head_major_qkv(rows, 1), rows)


def test_tp_sharded_attention_matches_unsharded(tiny4):
    # Emulate column/row-parallel attention by hand on the permuted weights: concatenating the
    # per-rank contexts and summing the row-parallel partial projections equals the full block.
    torch.manual_seed(0)
    ref = build_gpt(tiny4, seed=3)
    tp_model = build_gpt(tiny4, seed=3)
    permute_qkv_for_tp(tp_model, 2)
    attn_ref, attn = ref.blocks["0"].attn, tp_model.blocks["0"].attn
    x = torch.randn(2, tiny4.seq_len, tiny4.hidden_size)
    partial = torch.zeros_like(x)
    for r in range(2):
        w = attn.qkv.weight.chunk(2)[r]
        b = attn.qkv.bias.chunk(2)[r]
        q, k, v = torch.nn.functional.linear(x, w, b).chunk(3, dim=-1)
        hd = tiny4.head_dim
        q, k, v = (t.view(2, tiny4.seq_len, -1, hd).transpose(1, 2) for t in (q, k, v))
        s = q @ k.transpose(-2, -1) * hd**-0.5 + torch.full((tiny4.seq_len,) * 2, float("-inf")).triu(1)
        ctx = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(2, tiny4.seq_len, -1)
        partial += torch.nn.functional.linear(ctx, attn.proj.weight.chunk(2, dim=1)[r])
    torch.testing.assert_close(partial + attn.proj.bias, attn_ref(x), rtol=1e-5, atol=1e-6)


def test_stage_modules_compose_to_the_whole_model(tiny4):
    plan = Plan(pp=2, virtual_stages=2, schedule="interleaved_1f1b", global_batch_size=4)
    gpt = build_gpt(tiny4, seed=1)
    tokens = torch.randint(0, tiny4.vocab_size, (2, tiny4.seq_len))
    stages = {**build_stage_modules(gpt, plan, 0), **build_stage_modules(gpt, plan, 1)}
    x = tokens
    for s in range(plan.num_stages):
        x = stages[s](x)
    torch.testing.assert_close(x, gpt(tokens))
    # Parameter names are the unsplit model's, wherever a block lives.
    names = {n for m in stages.values() for n, _ in m.named_parameters()}
    assert names == {n for n, _ in gpt.named_parameters()}


def test_partition_and_placement():
    model = Model(**TINY)
    loop = Plan(pp=2, virtual_stages=2, schedule="interleaved_1f1b", partition=[1, 1, 1, 1])
    assert block_ranges(loop, model) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert local_stages(loop, 0) == [0, 2] and local_stages(loop, 1) == [1, 3]
    vee = Plan(pp=2, virtual_stages=2, schedule="zbv")
    assert local_stages(vee, 0) == [0, 3] and local_stages(vee, 1) == [1, 2]
    uneven = Plan(pp=2, partition=[3, 1])
    assert block_ranges(uneven, model) == [(0, 3), (3, 1)]


def test_mesh_axes_follow_rank_order():
    assert mesh_shape(Plan(dp=2, tp=4, pp=3, global_batch_size=2)) == ((3, 2, 4), ("pp", "dp", "tp"))
    assert mesh_shape(Plan(dp=2, tp=4, pp=3, global_batch_size=2, rank_order="dp-tp-pp")) == ((3, 4, 2), ("pp", "tp", "dp"))


def test_token_source_is_a_function_of_seed_and_step(tmp_path):
    model = Model(**TINY)
    plan = Plan(dp=2, micro_batch_size=2, global_batch_size=8)
    a, b = TokenSource(model, plan, seed=5), TokenSource(model, plan, seed=5)
    x1, y1 = a.global_batch_at(3)
    x2, y2 = b.global_batch_at(3)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # next-token targets
    assert not torch.equal(a.global_batch_at(4)[0], x1)
    lo, _ = a.local_batch_at(3, 1)
    assert torch.equal(lo, x1[4:8])
    text = tmp_path / "t.txt"
    text.write_bytes(bytes(range(256)) * 4)
    src = TokenSource(Model(**{**TINY, "vocab_size": 256}), plan, seed=0, data=str(text))
    xt, yt = src.global_batch_at(1)
    assert xt.shape == (8, TINY["seq_len"]) and int(xt.max()) < 256
    assert torch.equal((xt + 1) % 256, yt)  # consecutive bytes of the file


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_run_arguments(p, launcher=True)
    return p.parse_args(list(argv))


def test_run_config_roundtrip_and_rules(tmp_path):
    args = _args('{"pp": 2, "global_batch_size": 4}', "--nproc", "2", "--steps", "3", "--model", json.dumps(TINY),
                 "--checkpoint-dir", str(tmp_path), "--resume-from", "2")
    cfg = config_from_args(args)
    assert cfg.resume and cfg.resume_from == 2 and cfg.plan.pp == 2
    cfg.save(tmp_path / "c.json")
    assert RunConfig.load(tmp_path / "c.json") == cfg
    assert cfg.timeline_path == "measured.timeline.json"
    with pytest.raises(ContractError, match="--resume needs --checkpoint-dir"):
        config_from_args(_args("{}", "--nproc", "1", "--steps", "1", "--resume"))
    with pytest.raises(ContractError, match=r"file not found \('synthetic' or a text file\)"):
        config_from_args(_args("{}", "--nproc", "1", "--steps", "1", "--data", str(tmp_path / "missing.txt")))
    # A profiled step after the last one would never run: refused, not silently skipped.
    with pytest.raises(ContractError, match=r"--profile-step 5 is after the run's last step \(--steps 2\)"):
        config_from_args(_args("{}", "--nproc", "1", "--steps", "2", "--profile-step", "5"))
    assert config_from_args(_args("{}", "--nproc", "1", "--steps", "2", "--profile-step", "2")).profile_step == 2


def test_torchrun_command_single_node_and_rendezvous():
    single = torchrun_command(_args("{}", "--nproc", "4", "--steps", "1"), "cfg.json")
    assert single[1:3] == ["-m", "torch.distributed.run"] and "--master-addr" in single
    assert single[single.index("--master-addr") + 1] == "127.0.0.1" and single[-4:] == ["-m", "mindpipe.executor", "--config", "cfg.json"]
    multi = torchrun_command(_args("{}", "--nproc", "8", "--steps", "1", "--nnodes", "4", "--rdzv-backend", "c10d",
                                   "--rdzv-endpoint", "head:29400", "--rdzv-id", "job7"), "cfg.json")
    for flag, value in (("--nnodes", "4"), ("--rdzv-backend", "c10d"), ("--rdzv-endpoint", "head:29400"), ("--rdzv-id", "job7")):
        assert multi[multi.index(flag) + 1] == value
    assert "--master-addr" not in multi


def test_one_cpu_host_forks_its_ranks_and_gpus_or_several_nodes_use_torchrun():
    one_host = _args("{}", "--nproc", "4", "--steps", "1")
    spawned, runner = launch_command(one_host, "cfg.json", "cpu")
    assert runner == "the rank spawner"
    assert spawned[1:3] == ["-m", "mindpipe.executor.spawn"] and spawned[-2:] == ["--config", "cfg.json"]
    assert spawned[spawned.index("--nproc") + 1] == "4" and spawned[spawned.index("--master-port") + 1] == "0"  # the spawner binds a free one
    assert launch_command(one_host, "cfg.json", "cuda")[0][1:3] == ["-m", "torch.distributed.run"]
    nodes = _args("{}", "--nproc", "8", "--steps", "1", "--nnodes", "2", "--rdzv-backend", "c10d",
                  "--rdzv-endpoint", "head:29400")
    assert launch_command(nodes, "cfg.json", "cpu")[0][1:3] == ["-m", "torch.distributed.run"]


def test_the_spawners_root_cause_round_trips_and_names_the_rank(tmp_path, monkeypatch):
    from mindpipe.executor.rundir import RUN_DIR_ENV, read_root_cause, record_root_cause

    assert read_root_cause(tmp_path) is None
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    record_root_cause(2, -6)
    record_root_cause(0, 1)  # a later failure does not replace the first
    assert read_root_cause(tmp_path) == (2, -6)
    assert _first_error({}, ["no torchrun record here"], 1, (2, -6), "the rank spawner") == (
        "rank 2 was killed by SIGABRT without a Python error", 1)
    assert _first_error({}, ["spawn: lost"], -9, None, "the rank spawner") == ("the rank spawner was killed by SIGKILL", 1)


def test_first_error_prefers_the_root_cause():
    torchrun_tail = ["Root Cause (first observed failure):", "[0]:", "  rank      : 1 (local_rank: 1)",
                     "  exitcode  : 17 (pid: 99)"]
    records = {0: RankError(0, 2.0, "failure", "RuntimeError: peer closed", "")}
    assert _first_error(records, torchrun_tail) == (
        "rank 1 exited with code 17 without a Python error; then rank 0 failed: RuntimeError: peer closed", 1)
    records[1] = RankError(1, 1.0, "failure", "ValueError: bad", "")
    assert _first_error(records, torchrun_tail) == ("rank 1 failed: ValueError: bad (then ranks [0] failed too)", 1)
    records[1] = RankError(1, 1.0, "input", "data.bin: 3 bytes, need at least 18", "")
    assert _first_error(records, torchrun_tail) == (
        "rank 1 failed: data.bin: 3 bytes, need at least 18 (then ranks [0] failed too)", 2)  # bad input: exit 2
    killed = ["Root Cause (first observed failure):", "  rank      : 3 (local_rank: 3)", "  exitcode  : -9 (pid: 1)"]
    assert _first_error({}, killed) == ("rank 3 was killed by SIGKILL without a Python error", 1)
    assert _first_error({}, ["some output"], -9) == ("torchrun was killed by SIGKILL", 1)


def test_rank_errors_round_trip_through_the_run_directory(tmp_path, monkeypatch):
    from mindpipe.executor.rundir import RUN_DIR_ENV, read_errors, record_error

    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    record_error(1, ContractError("data.bin", None, "3 bytes, need at least 18"))
    record_error(1, RuntimeError("a later error of the same rank"))  # the first one is the cause: kept
    try:
        raise RuntimeError("first line\nsecond line")
    except RuntimeError as e:
        record_error(0, e)
    got = read_errors(tmp_path)
    assert (got[1].kind, got[1].error) == ("input", "data.bin: 3 bytes, need at least 18")
    assert (got[0].kind, got[0].error) == ("failure", "RuntimeError: first line")
    assert "second line" in got[0].traceback and "Traceback" in got[0].traceback


def test_collective_axis_inference():
    assert axis_of("send", {"pp": 2, "dp": 2, "tp": 2}) == "pp"
    assert axis_of("allreduce", {"pp": 2, "dp": 1, "tp": 2}) == "tp"
    assert axis_of("reducescatter", {"pp": 1, "dp": 4, "tp": 1}) == "dp"
    assert axis_of("allreduce", {"pp": 1, "dp": 2, "tp": 2}) == "unknown"


def test_schedule_source_resolution():
    assert resolve_schedule_source("torch", Plan(pp=2, global_batch_size=2)) == "torch"
    assert resolve_schedule_source("auto", Plan(pp=1)) == "torch"
    assert resolve_schedule_source("auto", Plan(pp=2, global_batch_size=2)) == "simulator"


def test_a_wrapped_error_is_reported_with_its_root_cause(tmp_path, monkeypatch):
    """torch pipelining re-raises a stage's error as "[Stage 0] failed to run forward:" plus debug
    text; the one line must carry the error underneath, and a contract error there stays an input error."""
    from mindpipe.executor.rundir import RUN_DIR_ENV, read_errors, record_error

    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    for rank, inner in ((0, AttributeError("'Ctx' object has no attribute 'op_output'")),
                        (1, ContractError("--memory-budget-gib", None, "rank 1 needs 3 GiB, over 2 GiB"))):
        try:
            try:
                raise inner
            except Exception as e:
                raise RuntimeError("[Stage 0] failed to run forward:\nstage debug info") from e
        except RuntimeError as e:
            record_error(rank, e)
    got = read_errors(tmp_path)
    assert got[0].kind == "failure"
    assert got[0].error == ("RuntimeError: [Stage 0] failed to run forward: ← "
                            "AttributeError: 'Ctx' object has no attribute 'op_output'")
    assert (got[1].kind, got[1].error) == ("input", "--memory-budget-gib: rank 1 needs 3 GiB, over 2 GiB")
    # a contract error raised *from* a library's error (a checkpoint DCP cannot load) is an input error too
    try:
        try:
            raise ValueError("Size mismatch")
        except ValueError as e:
            raise ContractError("ck/step-3", None, "cannot load this checkpoint into the run's model: Size mismatch") from e
    except ContractError as e:
        record_error(2, e)
    assert (read_errors(tmp_path)[2].kind, read_errors(tmp_path)[2].error) == \
        ("input", "ck/step-3: cannot load this checkpoint into the run's model: Size mismatch")


def test_fsdp_param_groups_reads_both_torch_layouts():
    """torch >= 2.12 keeps FSDP2's parameter groups in a list; torch 2.11 (seen on an H100) one
    group or None: every bf16 run failed in the noise probe before this helper read both."""
    from types import SimpleNamespace

    from mindpipe.executor.memory_account import fsdp_param_groups

    a, b = object(), object()
    assert fsdp_param_groups(SimpleNamespace(_fsdp_param_groups=[a, b])) == [a, b]
    assert fsdp_param_groups(SimpleNamespace(_fsdp_param_group=a)) == [a]
    assert fsdp_param_groups(SimpleNamespace(_fsdp_param_group=None)) == []
    assert fsdp_param_groups(SimpleNamespace()) == []


def test_the_spawner_refuses_a_bad_config_in_one_line_before_forking(tmp_path, capsys):
    from mindpipe.executor.spawn import main

    bad = tmp_path / "config.json"
    bad.write_text('{"x": 1}')
    for path in (bad, tmp_path / "missing.json"):
        assert main(["--nproc", "2", "--master-port", "1", "--config", str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"spawn: error: {path}: "), err


def test_a_bf16_cpu_run_is_noted_where_the_cpu_has_no_bf16_matrix_instructions(tmp_path, monkeypatch):
    from mindpipe.executor import precheck

    avx2, zen4 = tmp_path / "avx2", tmp_path / "zen4"
    avx2.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    zen4.write_text("processor\t: 0\nflags\t\t: fpu avx avx2 avx512f avx512_bf16\n")
    assert precheck.cpu_has_bf16_gemm(str(avx2)) is False
    assert precheck.cpu_has_bf16_gemm(str(zen4)) is True
    assert precheck.cpu_has_bf16_gemm(str(tmp_path / "none")) is None  # not Linux: no note
    model = Model(**TINY)
    for host, precision, noted in ((False, "bf16", True), (False, "fp32", False), (True, "bf16", False),
                                   (None, "bf16", False)):
        monkeypatch.setattr(precheck, "cpu_has_bf16_gemm", lambda host=host: host)
        plan = Plan(dp=2, micro_batch_size=1, global_batch_size=2, precision=precision)
        pre = precheck.check_run(model, plan, 2, "cpu", None)
        assert (precheck.CPU_BF16_NOTICE in pre.notes) is noted, (host, precision)
    plan = Plan(dp=2, micro_batch_size=1, global_batch_size=2)
    monkeypatch.setattr(precheck, "cpu_has_bf16_gemm", lambda: False)
    assert precheck.CPU_BF16_NOTICE not in precheck.check_run(model, plan, 2, "cuda", None).notes


def test_progress_round_trips_through_the_run_directory_and_prints_ever_less_often(tmp_path, monkeypatch, capsys):
    from mindpipe.executor import launch, rundir

    monkeypatch.setenv(rundir.RUN_DIR_ENV, str(tmp_path))
    assert rundir.read_progress(tmp_path) is None
    rundir.record_progress(rundir.Progress(3, 10, 9.0265751, 0.4851, 2))
    got = rundir.read_progress(tmp_path)
    assert got == rundir.Progress(3, 10, 9.0265751, 0.4851, 2)
    assert got.line() == "step 3/10  loss 9.026575 (replica 0 of 2)  0.4851 s/step"
    assert rundir.Progress(20, 40, None, 0.02, 1).line("subnet") == "subnet 20/40  0.02 s/subnet"
    assert [p.name for p in tmp_path.iterdir()] == ["progress.json"]  # replaced in place, no temporary left
    (tmp_path / "progress.json").write_text("{\"step\": 1")  # a torn record reads as none
    assert rundir.read_progress(tmp_path) is None

    clock = [100.0]
    monkeypatch.setattr(launch.time, "monotonic", lambda: clock[0])
    show = launch.ProgressLine(tmp_path)

    def at(t, step, steps=1000):
        clock[0] = 100.0 + t
        rundir.record_progress(rundir.Progress(step, steps, 1.0, 0.1))
        show()
        return [ln.split("] ")[1].split("  ")[0] for ln in capsys.readouterr().err.splitlines()]

    assert at(0.5, 1) == []             # under a second since the launch
    assert at(1.0, 2) == ["step 2/1000"]
    assert at(1.5, 2) == []             # no new step
    assert at(2.2, 5) == ["step 5/1000"]
    assert at(200.0, 900) == ["step 900/1000"]
    assert at(210.0, 950) == []         # 200 s in: a line per tenth of the time elapsed
    assert at(223.0, 990) == ["step 990/1000"]
    assert at(224.0, 1000) == ["step 1000/1000"]  # the last step always


def test_without_a_launcher_the_reporting_rank_prints_its_progress(monkeypatch, capsys, tmp_path):
    from mindpipe.executor import rundir

    monkeypatch.delenv(rundir.RUN_DIR_ENV, raising=False)
    clock = [0.0]
    monkeypatch.setattr(rundir.time, "perf_counter", lambda: clock[0])
    reads: list[int] = []
    rep = rundir.ProgressReporter(steps=30, replicas=1)
    for step, t in enumerate((0.5, 0.9, 2.0, 2.5, 30.0, 31.0), start=1):
        clock[0] = t
        rep.after(step, lambda s=step: reads.append(s) or 2.5, 0.25)
    rep.after(30, lambda: reads.append(30) or 2.0, 0.25)  # the last step, at once
    lines = capsys.readouterr().err.splitlines()
    assert reads == [1, 3, 5, 6, 30]  # the loss is read at most once a second (and at the last step)
    assert lines == ["executor: step 1/30  loss 2.500000  0.25 s/step", "executor: step 3/30  loss 2.500000  0.25 s/step",
                     "executor: step 5/30  loss 2.500000  0.25 s/step", "executor: step 30/30  loss 2.000000  0.25 s/step"]
    monkeypatch.setenv(rundir.RUN_DIR_ENV, str(tmp_path))  # with a launcher: recorded, not printed
    rep.after(30, lambda: 1.0, 0.25)
    assert capsys.readouterr().err == "" and rundir.read_progress(tmp_path).loss == 1.0
