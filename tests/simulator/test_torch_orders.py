"""Our per-rank compute orders against torch.distributed.pipelining's own schedule classes.

Torch's orders are built without a process group: the schedule classes are constructed with
mocked stages, as ``torch.distributed.pipelining._schedule_visualizer.get_schedule_ops`` does
(BACKGROUND.md §9). Idle slots (``None``) are dropped, fused ``OVERLAP_F_B`` actions are expanded
into their sub-actions (DualPipeV; we list the pair as F then B) and the per-rank REDUCE_GRAD
that GPipe/1F1B append is ignored, leaving the compute order.

Intended differences, pinned below:

* ``Schedule1F1B``'s informational ``pipeline_order`` is off by one on the last rank (it lists
  F1..Fm and never F0; the runtime loop is separate and correct, BACKGROUND.md §9). All other
  ranks must match exactly; on the last rank the F/B skeleton and the backward order match and
  the forward indices are torch's shifted by one.
* ``interleaved_1f1b`` with m == pp follows Megatron (all m·v forwards first); torch caps the
  warmup at (v−1)·p + 2(p−1−r), so ranks whose warmup is below m·v differ. For m a multiple of
  pp above pp the orders are identical; for m == pp each stage still runs its F and B in the
  same micro-batch order.
"""

from __future__ import annotations

from unittest import mock

import pytest
from mindpipe.simulator.schedules import build_schedule
from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
from torch.distributed.pipelining.stage import PipelineStage

COMPUTE = ("F", "B", "I", "W")


def torch_orders(class_name: str, pp: int, m: int, stages_per_rank: int) -> list[list[str]]:
    """Torch's per-rank compute order for a schedule class, built on mocked stages."""
    cls = get_schedule_class(class_name)
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank = 0
    stage.group_size = pp
    stage.submod = None
    stage.num_stages = pp * stages_per_rank
    if issubclass(cls, PipelineScheduleSingle):
        order = cls(stage, m)._get_pipeline_order()
    else:
        order = cls([stage] * stages_per_rank, m).pipeline_order
    out = []
    for r in range(pp):
        row: list[str] = []
        for a in order[r]:
            if a is None:
                continue
            if a.sub_actions is not None:
                row += [str(x) for x in a.sub_actions]
            elif a.computation_type.value in COMPUTE:
                row.append(str(a))
        out.append(row)
    return out


def ours(name: str, pp: int, m: int, v: int) -> list[list[str]]:
    return [[str(a) for a in o] for o in build_schedule(name, pp, m, v).orders]


def skeleton(row: list[str]) -> list[str]:
    return [a.strip("0123456789") for a in row]


@pytest.mark.parametrize("pp", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 3, 4, 8])
def test_gpipe_matches_torch(pp, m):
    assert ours("gpipe", pp, m, 1) == torch_orders("GPipe", pp, m, 1)


@pytest.mark.parametrize("pp", [2, 3, 4, 5])
@pytest.mark.parametrize("extra", [0, 1, 4])
def test_1f1b_matches_torch_except_its_last_rank_quirk(pp, extra):
    m = pp + extra  # torch's Schedule1F1B needs m >= pp
    mine, theirs = ours("1f1b", pp, m, 1), torch_orders("1F1B", pp, m, 1)
    assert mine[:-1] == theirs[:-1]
    last_mine, last_theirs = mine[-1], theirs[-1]
    assert skeleton(last_mine) == skeleton(last_theirs)
    assert [a for a in last_mine if "B" in a] == [a for a in last_theirs if "B" in a]
    if last_mine != last_theirs:  # torch still has the quirk: forward indices shifted by one
        shifted = [f"{pp - 1}F{int(a.split('F')[1]) + 1}" if "F" in a else a for a in last_mine]
        assert last_theirs == shifted


@pytest.mark.parametrize("pp", [1, 2, 3, 4])
@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("k", [2, 3])
def test_interleaved_matches_torch_when_m_exceeds_pp(pp, v, k):
    m = k * pp
    assert ours("interleaved_1f1b", pp, m, v) == torch_orders("Interleaved1F1B", pp, m, v)


@pytest.mark.parametrize(("pp", "v"), [(2, 2), (3, 2), (4, 2), (4, 3), (5, 2)])
def test_interleaved_m_equal_pp_is_megatrons_all_warmup(pp, v):
    m = pp
    mine, theirs = ours("interleaved_1f1b", pp, m, v), torch_orders("Interleaved1F1B", pp, m, v)
    for r in range(pp):
        assert skeleton(mine[r]) == ["F"] * (m * v) + ["B"] * (m * v)
        torch_warmup = min((v - 1) * pp + 2 * (pp - 1 - r), m * v)
        if torch_warmup >= m * v - 1:  # one steady (F, B) pair after the warmup is still all-F-first
            assert mine[r] == theirs[r]
        else:
            assert mine[r] != theirs[r]
        for kind in ("F", "B"):  # same per-stage micro-batch order, only the interleaving differs
            for st in range(r, pp * v, pp):
                pick = [a for a in mine[r] if a.startswith(f"{st}{kind}")]
                assert pick == [a for a in theirs[r] if a.startswith(f"{st}{kind}")]


# torch's ZB1P needs m % max(1, m // pp) == 0; m < pp is included (warmup capped at m).
ZB1P_CASES = [(pp, m) for pp in (1, 2, 3, 4, 5) for m in (1, 2, 4, 6, 8, 9, 10) if m % max(1, m // pp) == 0]


@pytest.mark.parametrize(("pp", "m"), ZB1P_CASES)
def test_zb_h1_matches_torch_zb1p_with_one_stage_per_rank(pp, m):
    assert ours("zb_h1", pp, m, 1) == torch_orders("InterleavedZeroBubble", pp, m, 1)


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 9, 12])
def test_zbv_matches_torch(pp, m):
    assert ours("zbv", pp, m, 2) == torch_orders("ZBVZeroBubble", pp, m, 2)


@pytest.mark.parametrize("pp", [1, 2, 3, 4])
@pytest.mark.parametrize("extra", [0, 1, 5])
def test_dualpipev_matches_torch_with_fused_pairs_split(pp, extra):
    m = 2 * pp + extra
    assert ours("dualpipev", pp, m, 2) == torch_orders("DualPipeV", pp, m, 2)
