"""Online repartition of a supernet pipeline (``--repartition``): layers move, losses stay bit-identical.

The space is ``supernet-mini`` with a 8192-entry vocabulary, whose LM head weighs on the last stage.
How much it outweighs the choice layers depends on the host's CPU (on the AVX-512 host of
2026-11-30 an even [4, 4] start sometimes measured within the threshold and stayed), so the runs
that must move start from the skewed [1, 7] (``SKEWED``): the last stage holds seven layers and the
head against one layer on the first, on any host.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from mindpipe.executor.supernet_config import SupernetRunConfig
from mindpipe.executor.supernet_launch import PartitionSpan, _history_line, partition_history
from mindpipe.executor.supernet_reference import train_sequential
from mindpipe.executor.supernet_repartition import decide_partition, moves, next_partition, predicted_times
from mindpipe.traces.builtin import load_supernet
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.measured import Measurement, SubnetSegment
from mindpipe.traces.schema import from_dict, to_dict
from mindpipe.traces.supernet import Supernet
from mindpipe.traces.trace import Trace

from tests.executor.conftest import TINY, mindpipe, run_env

HEAVY: dict[str, Any] = {**to_dict(load_supernet("supernet-mini")), "vocab_size": 8192}
NET = from_dict(Supernet, HEAVY)
SKEWED = [1, 7]


def _plan(dp: int, pp: int, **extra: Any) -> dict[str, Any]:
    return {"dp": dp, "pp": pp, "micro_batch_size": 2, "global_batch_size": 2 * dp, "subnet_schedule": "csp", **extra}


def _run(tmp: Path, plan: dict[str, Any], steps: int, out: str, *extra: str,
         model: dict[str, Any] | None = None) -> Measurement:
    env = run_env()
    (tmp / "tmp").mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp / "tmp")
    path = tmp / "model.json"
    path.write_text(json.dumps(model or HEAVY))
    r = mindpipe("run", json.dumps(plan), "--nproc", str(plan["dp"] * plan["pp"]), "--steps", str(steps),
                 "--model", str(path), "--device", "cpu", "--out", str(tmp / out), "--run-timeout", "300",
                 "--timeout", "120", *extra, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    m = Trace.load(tmp / out).measurement
    assert m is not None and m.subnets is not None and m.subnet_segments is not None
    return m


def _bits(m: Measurement) -> list[bytes]:
    assert m.subnets is not None
    return [struct.pack("<f", s.loss) for s in m.subnets]


# -- the decision rule (pure) -----------------------------------------------------------------


def test_heavy_last_stage_moves_layers_to_the_first() -> None:
    # 4 layers per stage at 1 ms each; the head adds 8 ms to the last stage.
    new = decide_partition([4.0, 12.0], [4, 4], 1.1)
    assert new == [7, 1]  # predicted [7, 9] against [4, 12]
    assert max(predicted_times(new, 1.0, 0.0, 8.0)) < 12.0


def test_within_threshold_or_no_better_partition_keeps_it() -> None:
    assert decide_partition([10.0, 10.5], [4, 4], 1.1) is None
    assert decide_partition([1.0], [8], 1.0) is None  # one stage: nothing to move
    assert decide_partition([7.0, 9.0], [7, 1], 1.0) is None  # the re-solve gives the same split


def test_a_move_must_promise_the_threshold_s_gain() -> None:
    # [4, 4] at [4, 7] (max/mean 1.27): c = 1, the head 3 -> [5, 3] predicts [5, 6], a gain of 7/6 = 1.17.
    assert decide_partition([4.0, 7.0], [4, 4], 1.1) == [5, 3]
    assert decide_partition([4.0, 7.0], [4, 4], 1.2) is None


def test_a_move_that_ran_slower_per_subnet_goes_back_and_stays() -> None:
    even = SubnetSegment(0, [4, 4], [4.0, 12.0], 0.030)
    assert next_partition([even], 1.1) == [7, 1]
    moved = SubnetSegment(10, [7, 1], [7.0, 9.0], 0.034)  # balanced stage times, yet slower per subnet
    assert next_partition([even, moved], 1.1) == [4, 4]
    assert next_partition([even, dataclasses.replace(moved, step_s=0.032)], 1.1) is None  # within the margin
    back = SubnetSegment(20, [4, 4], [4.0, 12.0], 0.031)
    assert next_partition([even, moved, back], 1.1) is None  # it went back once: it stays


def test_a_faster_move_is_kept_and_a_measured_partition_never_revisited() -> None:
    even = SubnetSegment(0, [4, 4], [4.0, 12.0], 0.030)
    moved = SubnetSegment(10, [7, 1], [14.0, 2.0], 0.020)  # the stage times now call for [4, 4] again
    assert decide_partition([14.0, 2.0], [7, 1], 1.1) == [4, 4]
    assert next_partition([even, moved], 1.1) is None
    # Segments without a wall time (files written before it was recorded) are judged on stage times only.
    old = [SubnetSegment(0, [4, 4], [4.0, 12.0]), SubnetSegment(10, [7, 1], [14.0, 2.0])]
    assert next_partition(old, 1.1) == [4, 4]
    assert next_partition([], 1.1) is None


def test_the_run_summary_lists_each_partition_once_with_its_mean_step_time() -> None:
    segs = [SubnetSegment(0, [6, 6], [0.3, 0.6], 0.7), SubnetSegment(10, [9, 3], [0.5, 0.4], 0.5),
            SubnetSegment(20, [9, 3], [0.5, 0.4], 0.3), SubnetSegment(30, [6, 6], [0.3, 0.6], None)]
    history = partition_history(segs)
    assert history == [PartitionSpan(0, [6, 6], 0.7), PartitionSpan(10, [9, 3], pytest.approx(0.4)),
                       PartitionSpan(30, [6, 6], None)]
    line = _history_line(1.1, history)
    assert line == ("repartition (threshold 1.1): 2 moves: [6, 6] from subnet 0 (0.7 s/subnet) -> "
                    "[9, 3] from subnet 10 (0.4 s/subnet) -> [6, 6] from subnet 30")
    assert _history_line(1.5, partition_history(segs[:1])).startswith("repartition (threshold 1.5): 0 moves: [6, 6]")


def test_moves_list_every_layer_that_changes_stage() -> None:
    assert moves([4, 4], [7, 1]) == [(4, 1, 0), (5, 1, 0), (6, 1, 0)]
    assert moves([3, 3, 2], [2, 3, 3]) == [(2, 0, 1), (5, 1, 2)]
    assert moves([4, 4], [4, 4]) == []


def test_repartition_needs_segments_and_a_threshold_of_at_least_one() -> None:
    plan = from_dict(Plan, _plan(1, 2))
    with pytest.raises(ContractError, match="checkpoint-every"):
        SupernetRunConfig(supernet=NET, plan=plan, steps=10, repartition=1.1)
    with pytest.raises(ContractError, match=">= 1"):
        SupernetRunConfig(supernet=NET, plan=plan, steps=10, checkpoint_every=5, repartition=0.5)
    for bad in (float("inf"), float("nan"), True):
        with pytest.raises(ContractError, match="finite number >= 1"):
            SupernetRunConfig(supernet=NET, plan=plan, steps=10, checkpoint_every=5, repartition=bad)


def test_repartition_is_refused_for_a_gpt_run(tmp_path: Path) -> None:
    r = mindpipe("run", json.dumps({"dp": 1, "pp": 2, "micro_batch_size": 1, "global_batch_size": 2}), "--nproc", "2",
                 "--steps", "2", "--model", json.dumps(TINY), "--device", "cpu", "--out", str(tmp_path / "m.json"),
                 "--repartition", "1.1")
    assert r.returncode == 2 and "--repartition is for supernet runs" in r.stderr


# -- runs ---------------------------------------------------------------------------------------


def test_repartitioned_run_is_bit_identical(tmp_path: Path) -> None:
    steps, plan = 30, _plan(1, 2, partition=SKEWED)
    moved = _run(tmp_path, plan, steps, "moved.json", "--checkpoint-every", "10", "--repartition", "1.0")
    fixed = _run(tmp_path, plan, steps, "fixed.json", "--checkpoint-every", "10")
    assert moved.subnet_segments is not None and fixed.subnet_segments is not None
    parts = [g.partition for g in moved.subnet_segments]
    assert parts[0] == SKEWED and parts[1][0] > 1, parts  # layers did move, to the first stage
    assert all(g.partition == SKEWED for g in fixed.subnet_segments)
    ref = [struct.pack("<f", r.loss) for r in train_sequential(NET, from_dict(Plan, plan), steps)]
    assert _bits(moved) == _bits(fixed) == ref


def test_repartition_with_context_switching_off_and_dp2(tmp_path: Path) -> None:
    steps, plan = 40, _plan(2, 2, partition=SKEWED)
    m = _run(tmp_path, plan, steps, "moved.json", "--checkpoint-every", "10", "--repartition", "1.0",
             "--context-switch", "off")
    assert m.subnet_segments is not None and m.subnet_segments[1].partition[0] > 1, m.subnet_segments
    ref = [struct.pack("<f", r.loss) for r in train_sequential(NET, from_dict(Plan, plan), steps)]
    assert _bits(m) == ref


def test_resume_after_a_repartition_keeps_the_moved_layout(tmp_path: Path) -> None:
    plan, ck = _plan(1, 2, partition=SKEWED), str(tmp_path / "ck")
    first = _run(tmp_path, plan, 20, "a.json", "--checkpoint-every", "10", "--repartition", "1.0",
                 "--checkpoint-dir", ck)
    assert first.subnet_segments is not None
    moved = first.subnet_segments[-1].partition
    assert moved[0] > 1, moved  # moved after subnets 0..9; the checkpoint at 20 holds that layout
    second = _run(tmp_path, plan, 40, "b.json", "--checkpoint-every", "10", "--repartition", "1.0",
                  "--checkpoint-dir", ck, "--resume")
    assert second.subnets is not None and second.subnets[0].id == 20
    assert second.subnet_segments is not None and second.subnet_segments[0].partition == moved
    ref = [struct.pack("<f", r.loss) for r in train_sequential(NET, from_dict(Plan, plan), 40)]
    assert _bits(first) + _bits(second) == ref


# The acceptance space of benchmarks/supernet_repartition.py (which times it: wall-clock ratios
# between runs drift 10-15 % on this shared 2-core machine, so the suite checks the moves and the
# losses, never the clock): 12 layers of 24 candidates (supernet-mini's six, four times over), h = 128,
# and a head (vocabulary 8192) worth about six layers on this CPU.
WIDE: dict[str, Any] = {**HEAVY, "num_layers": 12, "hidden_size": 128,
                        "candidates": [{**c, "name": f"{c['name']}_{i}"} for i in range(4) for c in HEAVY["candidates"]]}


@pytest.mark.slow
def test_even_start_on_the_heavy_head_space_moves_layers_to_the_first_stage(tmp_path: Path) -> None:
    """From [6, 6] the measured imbalance (the head on stage 1) moves layers to stage 0; losses stay sequential's.

    At which boundary the run moves, and whether it then keeps the move or goes back, depends on the
    measured times (a noisy first segment may stay under the threshold: seen once in a CI run, where
    the move came one segment later), so the test replays the rule on the recorded segments instead
    of guessing, and asks only that the run's first move takes layers to stage 0.
    """
    steps, plan = 40, _plan(1, 2)
    m = _run(tmp_path, plan, steps, "moved.json", "--checkpoint-every", "10", "--repartition", "1.1", model=WIDE)
    assert m.subnet_segments is not None
    parts = [g.partition for g in m.subnet_segments]
    assert parts[0] == [6, 6], parts
    # Every boundary follows the recorded times: the rule replayed on them gives the same partitions.
    for i in range(1, len(parts)):
        assert parts[i] == (next_partition(m.subnet_segments[:i], 1.1) or parts[i - 1]), (i, m.subnet_segments)
    moved = [i for i in range(1, len(parts)) if parts[i] != parts[i - 1]]
    assert moved and parts[moved[0]][0] > 6, m.subnet_segments  # the head makes stage 1 the slow one
    ref = [struct.pack("<f", r.loss) for r in train_sequential(from_dict(Supernet, WIDE), from_dict(Plan, plan), steps)]
    assert _bits(m) == ref
