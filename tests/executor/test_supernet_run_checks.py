"""The supernet run path: what a NAS researcher sees from ``mindpipe run --model SUPERNET``.

* a ``sync`` run whose last drained segment is not a whole batch is refused before any rank starts
  (it used to launch, train the first segments and fail inside a rank);
* ``measured.json``'s per-rank ``peak_memory_bytes`` is what its ``memory_source`` says (the process's
  resident set on a CPU), not the context switcher's model-state count relabelled.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mindpipe.executor.supernet_config import SupernetRunConfig
from mindpipe.traces.builtin import load_plan, load_supernet
from mindpipe.traces.errors import ContractError
from mindpipe.traces.trace import Trace

from .conftest import mindpipe, run_env

NET = load_supernet("supernet-mini")
SYNC = '{"pp":2,"micro_batch_size":2,"global_batch_size":2,"subnet_schedule":"sync"}'  # batch = window = 4


def test_sync_last_segment_must_be_whole_batches() -> None:
    # 10 subnets in segments of 4: 4, 4, then 2 — half a batch of 4.
    with pytest.raises(ContractError, match="multiple"):
        SupernetRunConfig(supernet=NET, plan=load_plan(SYNC), steps=10, checkpoint_every=4, checkpoint_dir="/tmp/x")
    # Whole batches everywhere still run: 12 in segments of 4, and 8 in one segment.
    SupernetRunConfig(supernet=NET, plan=load_plan(SYNC), steps=12, checkpoint_every=4, checkpoint_dir="/tmp/x")
    SupernetRunConfig(supernet=NET, plan=load_plan(SYNC), steps=8)


def test_sync_partial_last_batch_refused_in_one_line_before_launch(tmp_path: Path) -> None:
    env = dict(run_env())
    env["TMPDIR"] = str(tmp_path)
    res = mindpipe("run", SYNC, "--nproc", "2", "--steps", "10", "--model", "supernet-mini", "--device", "cpu",
                   "--out", str(tmp_path / "m.json"), "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every",
                   "4", "--run-timeout", "200", "--timeout", "60", env=env)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and "executor.spawn" not in res.stderr  # refused before any rank started
    assert [ln for ln in res.stderr.splitlines() if ln.startswith("mindpipe: error:")] == res.stderr.strip().splitlines()
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").iterdir())


def test_measured_rank_memory_is_what_its_source_says(tmp_path: Path) -> None:
    env = dict(run_env())
    env["TMPDIR"] = str(tmp_path)
    plan = '{"pp":2,"micro_batch_size":2,"global_batch_size":2}'
    res = mindpipe("run", plan, "--nproc", "2", "--steps", "4", "--model", "supernet-mini", "--device", "cpu",
                   "--out", str(tmp_path / "m.json"), "--run-timeout", "200", "--timeout", "60", env=env)
    assert res.returncode == 0, res.stderr
    m = Trace.load(tmp_path / "m.json").measurement
    assert m is not None and m.subnet_stages is not None
    state = {r.rank: r.resident_state_bytes for r in m.subnet_stages}
    for r in m.ranks:
        assert r.memory_source == "process_rss"
        # A process that imported torch holds far more than 32 MiB resident; the supernet's model state
        # here is under 2 MiB, so a figure that small is not a resident set.
        assert r.peak_memory_bytes > 32 * 2**20 > state[r.rank]
    raw = json.loads((tmp_path / "m.json").read_text())
    assert all(s["resident_state_bytes"] < 2**21 for s in raw["measurement"]["subnet_stages"])


def test_a_plan_precision_the_executor_does_not_run_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    from mindpipe.executor.supernet_launch import precheck

    bf16 = load_plan('{"pp":2,"micro_batch_size":2,"global_batch_size":2}')  # the plan default, what tune searches
    precheck(SupernetRunConfig(supernet=NET, plan=bf16, steps=4), 2, "plan")
    err = capsys.readouterr().err
    assert "trains in fp32" in err and "bf16" in err and len(err.splitlines()) == 1
    fp32 = load_plan('{"pp":2,"micro_batch_size":2,"global_batch_size":2,"precision":"fp32"}')
    precheck(SupernetRunConfig(supernet=NET, plan=fp32, steps=4), 2, "plan")
    assert capsys.readouterr().err == ""


def test_context_switching_keeps_what_the_simulator_counts(tmp_path: Path) -> None:
    """With switching, a stage holds its in-flight subnets' candidates plus the next forward's, prefetched
    one subnet ahead (simulator/subnet_memory.py; NASPipe): the measured resident peak is that set's."""
    from mindpipe.simulator.subnet_schedules import build_subnet_schedule
    from mindpipe.traces.supernet import sample_subnets, subnet_stage_operators

    env = dict(run_env())
    env["TMPDIR"] = str(tmp_path)
    n, plan_text = 16, '{"pp":2,"micro_batch_size":2,"global_batch_size":2}'
    res = mindpipe("run", plan_text, "--nproc", "2", "--steps", str(n), "--model", "supernet-mini", "--device", "cpu",
                   "--out", str(tmp_path / "m.json"), "--run-timeout", "200", "--timeout", "60", env=env)
    assert res.returncode == 0, res.stderr
    m = Trace.load(tmp_path / "m.json").measurement
    assert m is not None and m.subnet_stages is not None
    plan, h = load_plan(plan_text), NET.hidden_size
    subnets = sample_subnets(NET, n)
    sched = build_subnet_schedule("csp", [subnet_stage_operators(NET, plan, c) for c in subnets], 2, 4)
    size = [c.param_count(h) for c in NET.candidates]
    shared = [NET.vocab_size * h + NET.seq_len * h, 2 * h + NET.vocab_size * h]
    for st in m.subnet_stages:
        layers = range(4 * st.stage, 4 * st.stage + 4)
        order = sched.orders[st.stage]
        forwards = [a.microbatch for a in order if a.kind == "F"]
        flying: set[int] = set()
        peak, done = 0, 0
        for a in order:
            if a.kind == "B":
                flying.discard(a.microbatch)
                continue
            flying.add(a.microbatch)
            done += 1
            on = flying | set(forwards[done:done + 1])
            keys = {(layer, subnets[w][layer]) for w in on for layer in layers}
            peak = max(peak, sum(size[c] for _, c in keys))
        assert st.resident_param_bytes == 4 * (shared[st.stage] + peak), st.stage
