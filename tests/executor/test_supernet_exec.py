"""Supernet runs: CSP over dp × pp ranks equals sequential single-process training, bit for bit.

Each run trains 200 subnets of ``supernet-mini`` (micro-batch 2) with ``mindpipe run`` on CPU/gloo
and compares every subnet's loss with :func:`~mindpipe.executor.supernet_reference.train_sequential`
as float32 bits (never a tolerance). Also: measured.json's subnet records, the resume after a
killed run, and the context-switching memory budget.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest
from mindpipe.executor.supernet_reference import SubnetLoss, train_sequential
from mindpipe.traces.builtin import load_supernet
from mindpipe.traces.config import Plan
from mindpipe.traces.measured import Measurement
from mindpipe.traces.schema import from_dict
from mindpipe.traces.trace import Trace

from tests.executor.conftest import mindpipe, run_env

N = 120
NET = load_supernet("supernet-mini")


def _plan(dp: int, pp: int, schedule: str = "csp", **extra: Any) -> dict[str, Any]:
    return {"dp": dp, "pp": pp, "micro_batch_size": 2, "global_batch_size": 2 * dp, "subnet_schedule": schedule,
            **extra}


def _run(tmp: Path, plan: dict[str, Any], *extra: str, steps: int = N, env: dict[str, str] | None = None,
         out: str = "measured.json") -> Any:
    env = dict(env or run_env())
    (tmp / "tmp").mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp / "tmp")
    return mindpipe("run", json.dumps(plan), "--nproc", str(plan["dp"] * plan["pp"]), "--steps", str(steps),
                    "--model", "supernet-mini", "--device", "cpu", "--out", str(tmp / out), "--run-timeout", "500",
                    "--timeout", "120", *extra, env=env)


def _measurement(path: Path) -> Measurement:
    m = Trace.load(path).measurement
    assert m is not None and m.subnets is not None
    return m


def _bits(x: float) -> bytes:
    return struct.pack("<f", x)


_REFERENCE: dict[tuple[int, int], list[SubnetLoss]] = {}


def _reference(dp: int, pp: int) -> list[SubnetLoss]:
    if (dp, pp) not in _REFERENCE:
        plan = from_dict(Plan, _plan(dp, pp))
        _REFERENCE[(dp, pp)] = train_sequential(NET, plan, N)
    return _REFERENCE[(dp, pp)]


def _assert_identical(m: Measurement, dp: int, pp: int, first: int = 0) -> None:
    ref = _reference(dp, pp)
    assert m.subnets is not None
    assert [s.id for s in m.subnets] == list(range(first, N))
    for s in m.subnets:
        r = ref[s.id]
        assert tuple(s.choices) == r.choices
        assert _bits(s.loss) == _bits(r.loss), f"subnet {s.id}: {s.loss.hex()} != {r.loss.hex()}"


def test_csp_pp2_bit_identical_and_measured(tmp_path: Path) -> None:
    res = _run(tmp_path, _plan(1, 2))
    assert res.returncode == 0, res.stderr
    m = _measurement(tmp_path / "measured.json")
    _assert_identical(m, 1, 2)
    assert m.subnet_schedule == "csp" and m.subnets_per_hour is not None and m.subnets_per_hour > 0
    assert [st.step for st in m.steps] == [i + 1 for i in range(N)]
    assert m.subnet_stages is not None and sorted(r.stage for r in m.subnet_stages) == [0, 1]
    for r in m.subnet_stages:
        assert r.compute_s > 0 and r.context_switch
        # Switching keeps a subnet's candidates, not the whole stage: fewer bytes than the stage holds.
        assert 0 < r.resident_param_bytes < r.param_bytes
    # The losses move: training happened (synthetic tokens are uniform: the loss approaches ln V from above).
    assert m.subnets[0].loss != m.subnets[-1].loss


def test_sequential_schedule_matches_too(tmp_path: Path) -> None:
    res = _run(tmp_path, _plan(1, 2, "sequential"), steps=40, out="seq.json")
    assert res.returncode == 0, res.stderr
    m = _measurement(tmp_path / "seq.json")
    ref = _reference(1, 2)
    assert m.subnets is not None
    assert [_bits(s.loss) for s in m.subnets] == [_bits(r.loss) for r in ref[:40]]


@pytest.mark.slow
def test_csp_pp4_bit_identical(tmp_path: Path) -> None:
    res = _run(tmp_path, _plan(1, 4))
    assert res.returncode == 0, res.stderr
    _assert_identical(_measurement(tmp_path / "measured.json"), 1, 4)


@pytest.mark.slow
def test_csp_dp2_pp2_bit_identical(tmp_path: Path) -> None:
    res = _run(tmp_path, _plan(2, 2))
    assert res.returncode == 0, res.stderr
    m = _measurement(tmp_path / "measured.json")
    _assert_identical(m, 2, 2)
    # The launcher showed the run's progress, its last subnet always, with replica 0's loss of it
    # (the run's loss is the mean of both replicas').
    last = rf"^mindpipe: \[ +\d+ s\] subnet {N}/{N}  loss \d+\.\d{{6}} \(replica 0 of 2\)  \S+ s/subnet$"
    assert re.search(last, res.stderr, re.M), res.stderr
    assert m.subnet_stages is not None and {(r.stage, r.dp_rank) for r in m.subnet_stages} == {
        (0, 0), (0, 1), (1, 0), (1, 1)}


@pytest.mark.slow
def test_resume_after_kill_is_bit_identical(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    common = ("--checkpoint-dir", str(ckpt), "--checkpoint-every", "30")
    # Rank 1 dies without a Python error when it reaches subnet 61 (after the checkpoint of 60).
    killed = _run(tmp_path, _plan(1, 2), *common, env=run_env(MINDPIPE_FAULT="1:61:exit"), out="killed.json")
    assert killed.returncode == 1, killed.stderr
    assert "rank 1" in killed.stderr and not (tmp_path / "killed.json").exists()
    assert json.loads((ckpt / "latest.json").read_text())["step"] == 60
    resumed = _run(tmp_path, _plan(1, 2), *common, "--resume", out="resumed.json")
    assert resumed.returncode == 0, resumed.stderr
    _assert_identical(_measurement(tmp_path / "resumed.json"), 1, 2, first=60)


def test_context_switching_fits_a_budget_the_full_stage_does_not(tmp_path: Path) -> None:
    # pp4 with window 2: each stage holds 2 layers × 6 candidates; in flight at most 3 per layer.
    plan = _plan(1, 4, subnet_window=2)
    budget = ("--memory-budget-gib", "0.0024")  # 2.58 MB: full stage state 2.82-2.96 MB, switched bound <= 2.28 MB
    refused = _run(tmp_path, plan, *budget, "--context-switch", "off", steps=40, out="off.json")
    assert refused.returncode == 2, refused.stderr
    lines = [ln for ln in refused.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "memory_budget_gib" in lines[0] and "without context switching" in lines[0]
    assert not (tmp_path / "off.json").exists()
    res = _run(tmp_path, plan, *budget, "--context-switch", "on", steps=40, out="on.json")
    assert res.returncode == 0, res.stderr
    m = _measurement(tmp_path / "on.json")
    assert m.subnet_stages is not None and len(m.subnet_stages) == 4
    limit = int(0.0024 * (1 << 30))
    for r in m.subnet_stages:
        assert r.context_switch and r.resident_state_bytes <= limit
        assert r.resident_param_bytes < r.param_bytes
    ref = _reference(1, 4)
    assert m.subnets is not None
    assert [_bits(s.loss) for s in m.subnets] == [_bits(r.loss) for r in ref[:40]]


def test_sync_batch_reads_the_weights_of_its_start(tmp_path: Path) -> None:
    # sync with subnet_window 2: subnets 0 and 1 form a batch; both forwards see the initial weights.
    res = _run(tmp_path, _plan(1, 2, "sync", subnet_window=2), "--context-switch", "off", steps=4, out="sync.json")
    assert res.returncode == 0, res.stderr
    m = _measurement(tmp_path / "sync.json")
    assert m.subnets is not None and [s.id for s in m.subnets] == [0, 1, 2, 3]
    import torch
    from mindpipe.traces.supernet import sample_subnet
    from mindpipe.traces.torch_supernet import build_supernet_stages, synthetic_tokens

    torch.set_num_threads(1)
    stages = build_supernet_stages(NET, [4, 4], seed=0)
    for i in (0, 1):
        rows = synthetic_tokens(NET, 0, i, 2)
        x = rows[:, :-1]
        for st in stages:
            x = st(x, sample_subnet(NET, i))
        assert _bits(float(stages[-1].loss(x, rows[:, 1:]).detach())) == _bits(m.subnets[i].loss)
    ref = _reference(1, 2)
    shares = set(enumerate(ref[0].choices)) & set(enumerate(ref[1].choices))
    # Sequential training updates subnet 0's candidates before subnet 1 runs; sync does not.
    assert (_bits(m.subnets[1].loss) == _bits(ref[1].loss)) == (not shares)


def test_async_is_refused_before_launch(tmp_path: Path) -> None:
    res = _run(tmp_path, _plan(1, 2, "async"), steps=4, out="async.json")
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "subnet_schedule" in lines[0] and "weight stashing" in lines[0]


@pytest.mark.gpu
def test_cuda_run_with_context_switching(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    plan = {"dp": 1, "pp": 1, "micro_batch_size": 2, "global_batch_size": 2, "subnet_schedule": "csp",
            "subnet_window": 2}
    res = mindpipe("run", json.dumps(plan), "--nproc", "1", "--steps", "20", "--model", "supernet-mini",
                   "--device", "cuda", "--context-switch", "on", "--out", str(tmp_path / "gpu.json"))
    assert res.returncode == 0, res.stderr[-4000:]
    m = _measurement(tmp_path / "gpu.json")
    assert m.backend == "nccl" and m.subnet_stages is not None
    assert m.subnet_stages[0].resident_param_bytes < m.subnet_stages[0].param_bytes
