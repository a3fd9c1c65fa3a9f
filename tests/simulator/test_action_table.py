"""Action tables in torch's compute-only CSV: round trips, errors, and torch's own loader."""

from __future__ import annotations

import csv
import json
import os
import socket
import string
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mindpipe.simulator.action_table import read_csv, write_csv
from mindpipe.simulator.actions import Action, Schedule
from mindpipe.simulator.schedules import build_schedule
from mindpipe.traces.errors import ContractError
from torch.distributed.pipelining.schedules import (
    _PipelineScheduleRuntime,
    _simulate_comms_compute,
    get_schedule_class,
)
from torch.distributed.pipelining.stage import PipelineStage

CASES = [
    ("gpipe", 3, 4, 1),
    ("1f1b", 4, 8, 1),
    ("1f1b", 1, 3, 1),
    ("interleaved_1f1b", 4, 8, 2),
    ("interleaved_1f1b", 2, 2, 3),
    ("zb_h1", 4, 8, 1),
    ("zb_h1", 3, 2, 1),
    ("zbv", 4, 8, 2),
    ("zbv", 3, 2, 2),
    ("dualpipev", 3, 7, 2),
]


def mocked_stages(pp: int, num_stages: int) -> list:
    """Stand-ins for this rank's PipelineStage objects (no process group), as torch's visualizer uses."""
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank = 0
    stage.group_size = pp
    stage.submod = None
    stage.num_stages = num_stages
    return [stage] * (num_stages // pp)


@pytest.mark.parametrize(("name", "pp", "m", "v"), CASES)
def test_round_trip(tmp_path, name, pp, m, v):
    s = build_schedule(name, pp, m, v)
    path = tmp_path / f"{name}.csv"
    write_csv(s, path)
    back = read_csv(path, name)
    assert back == s
    assert read_csv(path, name, num_microbatches=m, stage_to_rank=s.stage_to_rank) == s


def test_file_format_is_one_row_per_rank(tmp_path):
    path = tmp_path / "t.csv"
    write_csv(build_schedule("1f1b", 2, 2), path)
    assert path.read_bytes() == b"0F0,0F1,0B0,0B1\r\n1F0,1B0,1F1,1B1\r\n"


@pytest.mark.parametrize(("name", "pp", "m", "v"), CASES)
def test_torch_runtime_loads_and_lowers_our_table(tmp_path, name, pp, m, v):
    """What the executor does: _PipelineScheduleRuntime._load_csv on our file (torch validates it,
    infers the stage placement and adds send/recv), then torch's unit-step comms simulation."""
    s = build_schedule(name, pp, m, v)
    path = tmp_path / "t.csv"
    write_csv(s, path)
    runtime = _PipelineScheduleRuntime(mocked_stages(pp, s.num_stages), m)
    runtime._load_csv(str(path), format="compute_only")
    assert {r: [str(a) for a in acts] for r, acts in runtime.pipeline_order.items()} == {
        r: [str(a) for a in o] for r, o in enumerate(s.orders)
    }
    assert runtime.stage_index_to_group_rank == dict(enumerate(s.stage_to_rank))
    # torch's dry run rejects REDUCE_GRAD/UNSHARD/RESHARD (BACKGROUND.md §9): keep compute + p2p.
    keep = ("F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B")
    lowered = {r: [a for a in acts if a.computation_type.value in keep]
               for r, acts in runtime.pipeline_order_with_comms.items()}
    if pp > 1:
        assert any(a.computation_type.value == "SEND_F" for acts in lowered.values() for a in acts)
    sim = _simulate_comms_compute(lowered, lambda i: runtime.stage_index_to_group_rank[i], s.num_stages)
    ran = sorted(str(a) for acts in sim.values() for a in acts if a is not None and a.computation_type.value in "FBIW")
    assert ran == sorted(str(a) for o in s.orders for a in o)


@pytest.mark.parametrize(("cls", "name", "pp", "m", "v"), [
    ("Interleaved1F1B", "interleaved_1f1b", 4, 8, 2),  # torch writes idle slots as empty cells
    ("ZBVZeroBubble", "zbv", 3, 4, 2),
    ("DualPipeV", "dualpipev", 2, 5, 2),  # fused (F;B)OVERLAP_F_B cells
])
def test_reads_tables_torch_dumps(tmp_path, cls, name, pp, m, v):
    schedule = get_schedule_class(cls)(mocked_stages(pp, pp * v), m)
    path = tmp_path / "torch.csv"
    schedule._dump_csv(str(path), format="compute_only")
    with open(path, newline="") as f:
        cells = [c for row in csv.reader(f) for c in row]
    assert any(c == "" or "OVERLAP_F_B" in c for c in cells)  # exercises the idle / fused cells
    assert read_csv(path, name) == build_schedule(name, pp, m, v)


def test_torch_writes_back_our_bytes(tmp_path):
    s = build_schedule("zbv", 3, 6, 2)
    ours, theirs = tmp_path / "ours.csv", tmp_path / "theirs.csv"
    write_csv(s, ours)
    runtime = _PipelineScheduleRuntime(mocked_stages(3, 6), 6)
    runtime._load_csv(str(ours))
    runtime._dump_csv(str(theirs), format="compute_only")
    assert theirs.read_bytes() == ours.read_bytes()


def write_rows(path: Path, rows: list[str]) -> Path:
    path.write_text("".join(r + "\r\n" for r in rows))
    return path


@pytest.mark.parametrize(("rows", "kwargs", "key", "rule"), [
    (["0F0,0X0,0B0"], {}, "row 1 (rank 0), cell 2", "'0X0' is not a compute action"),
    (["0F0,0B0", "1F0,1SEND_F0,1B0"], {}, "row 2 (rank 1), cell 2", "'1SEND_F0' is not a compute action"),
    (["0F0,0B0,1F0", "1F0,1B0"], {}, "row 2 (rank 1), cell 1",
     "1F0 puts stage 1 on rank 1, but row 1 (rank 0), cell 3 put it on rank 0"),
    (["0F0,0F1,0B0,0B1"], {"num_microbatches": 1}, "row 1 (rank 0), cell 2",
     "0F1 names micro-batch 1, but num_microbatches=1"),
    (["0F0,0B0", "1F0,1B0"], {"stage_to_rank": [1, 0]}, "row 1 (rank 0), cell 1",
     "0F0 runs on rank 0, but the given stage_to_rank places stage 0 on rank 1"),
    (["0F0,0B0", "1F0,1B0"], {"stage_to_rank": [0]}, "row 2 (rank 1), cell 1",
     "1F0 names stage 1, but the given stage_to_rank has 1 stages"),
    (["0F0,0B0", ""], {}, "row 2 (rank 1)", "rank has no actions"),
    (["0F0,0B0,2F0,2B0", "3F0,3B0"], {}, None, "stages [1] appear in no cell"),
    (["0F0,0B0"], {"stage_to_rank": [0, 0]}, None, "the table has 1 stages, the given stage_to_rank 2"),
    (["0F0,0F1,0B0"], {}, None, "stage 0 micro-batch 1 on rank 0 has F; needs F and either B or I and W"),
    (["0F0,0B0,0F1,0B1", "1F1,1F0,1B0,1B1"], {}, None,
     "rank 1 is stuck at 1F1 (position 0), waiting for F(0,1) on rank 0"),
])
def test_read_errors_name_file_row_cell_and_rule(tmp_path, rows, kwargs, key, rule):
    path = write_rows(tmp_path / "bad.csv", rows)
    with pytest.raises(ContractError) as e:
        read_csv(path, "custom", **kwargs)
    assert e.value.source == str(path)
    assert e.value.key == key
    assert rule in e.value.rule


def test_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("")
    with pytest.raises(ContractError, match="no rows"):
        read_csv(path, "x")


def test_write_refuses_a_deadlocking_schedule(tmp_path):
    bad = Schedule("bad", 2, 2, 2, [0, 1], [
        [Action.parse(t) for t in ["0F0", "0B0", "0F1", "0B1"]],
        [Action.parse(t) for t in ["1F1", "1F0", "1B0", "1B1"]],
    ])
    with pytest.raises(ValueError, match="deadlock"):
        write_csv(bad, tmp_path / "bad.csv")
    assert not (tmp_path / "bad.csv").exists()


def valid_args():
    def for_name(name: str):
        if name == "interleaved_1f1b":
            return st.tuples(st.just(name), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3)).map(
                lambda t: (t[0], t[1], t[1] * t[2], t[3]))
        if name == "dualpipev":
            return st.tuples(st.just(name), st.integers(1, 4), st.integers(0, 4)).map(
                lambda t: (t[0], t[1], 2 * t[1] + t[2], 2))
        v = 2 if name == "zbv" else 1
        return st.tuples(st.just(name), st.integers(1, 5), st.integers(1, 9), st.just(v))

    return st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv", "dualpipev"]).flatmap(for_name)


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(args=valid_args())
def test_round_trip_property(tmp_path, args):
    s = build_schedule(*args)
    path = tmp_path / "p.csv"
    write_csv(s, path)
    assert read_csv(path, args[0]) == s


@SETTINGS
@given(args=valid_args(), data=st.data())
def test_corrupted_tables_raise_contract_errors_only(tmp_path, args, data):
    """Any edit of one cell gives either a valid schedule or a ContractError, never a crash."""
    s = build_schedule(*args)
    rows = [[str(a) for a in o] for o in s.orders]
    r = data.draw(st.integers(0, len(rows) - 1))
    c = data.draw(st.integers(0, len(rows[r]) - 1))
    rows[r][c] = data.draw(st.text(alphabet=string.digits + "FBIW()_;OVERLAP ", max_size=8))
    path = write_rows(tmp_path / "c.csv", [",".join(row) for row in rows])
    try:
        back = read_csv(path, args[0])
    except ContractError as e:
        assert e.source == str(path)
    else:
        assert back.pp == s.pp


WIDTH = 8


def _blocks(n: int) -> list:
    torch.manual_seed(0)
    return [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()) for _ in range(n)]


def _mse(out, target):
    return ((out - target) ** 2).mean()


def _batch(m: int):
    g = torch.Generator().manual_seed(1)
    return torch.randn(2 * m, WIDTH, generator=g), torch.randn(2 * m, WIDTH, generator=g)


def _run_rank(rank: int, world: int, port: int, name: str, m: int, v: int, path: str, out: str) -> None:
    """One pipeline rank: torch's runtime executes our CSV on gloo; gradients go to ``out``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        s = build_schedule(name, world, m, v)
        blocks = _blocks(s.num_stages)
        mine = s.stages_of_rank(rank)
        stages = [PipelineStage(blocks[i], i, s.num_stages, torch.device("cpu")) for i in mine]
        runtime = _PipelineScheduleRuntime(stages, n_microbatches=m, loss_fn=_mse, scale_grads=True)
        runtime._load_csv(path, format="compute_only")
        x, y = _batch(m)
        kwargs = {"target": y, "losses": []} if s.num_stages - 1 in mine else {}
        if 0 in mine:
            runtime.step(x, **kwargs)
        else:
            runtime.step(**kwargs)
        grads = {i: [p.grad.tolist() for p in blocks[i].parameters()] for i in mine}
        Path(out, f"{rank}.json").write_text(json.dumps(grads))
    finally:
        dist.destroy_process_group()


def test_torch_runtime_executes_our_table_on_gloo(tmp_path):
    """Gradients of torch's runtime running our table on 2 gloo ranks equal a single-process run.

    DualPipeV exercises the most: V placement, F, full B, split I/W, and the fused pairs listed
    as F then B. (One case only: each rank process imports torch, the slow part on 2 cores.)
    """
    name, pp, m = "dualpipev", 2, 5
    s = build_schedule(name, pp, m, 2)
    write_csv(s, tmp_path / "t.csv")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_run_rank, args=(pp, port, name, m, 2, str(tmp_path / "t.csv"), str(tmp_path)), nprocs=pp, join=True)
    got: dict[int, list] = {}
    for r in range(pp):
        got.update({int(k): g for k, g in json.loads((tmp_path / f"{r}.json").read_text()).items()})
    blocks = _blocks(s.num_stages)
    x, y = _batch(m)
    loss = torch.zeros(())
    for xb, yb in zip(x.chunk(m), y.chunk(m), strict=True):
        h = xb
        for blk in blocks:
            h = blk(h)
        loss = loss + _mse(h, yb) / m
    loss.backward()
    for idx, blk in enumerate(blocks):
        for g, p in zip(got[idx], blk.parameters(), strict=True):
            assert p.grad is not None
            torch.testing.assert_close(torch.tensor(g), p.grad, rtol=1e-5, atol=1e-6)
