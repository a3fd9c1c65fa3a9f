"""The measured-run contract holds one ``ranks`` record per rank (traces/measured.py).

The executor writes a record for every rank; a list that leaves one out is a truncated or edited
file, which calibration would otherwise fit on in silence (the host CPU and optimizer fits read
every rank's record, the measured timeline the pipeline's).
"""

from __future__ import annotations

import pytest
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.measured import Measurement, RankRecord, StepRecord
from mindpipe.traces.schema import from_dict, to_dict


def _rank(g: int, plan: Plan) -> RankRecord:
    return RankRecord(g, g // plan.dp, g % plan.dp, 0, [g // plan.dp], "h", 0.1, 0.0, 0.0, 0.01, 1000, "process_rss")


def _measurement(plan: Plan, ranks: list[int]) -> Measurement:
    return Measurement(plan=plan, world_size=plan.world_size, nodes=1, backend="gloo", device_kind="cpu",
                       device_name="cpu", threads_per_rank=1, torch_version="2.13.0", schedule_source="torch",
                       seed=0, data="synthetic", warmup_steps=0, steps=[StepRecord(1, 5.0, 0.1, 1.0)],
                       tokens_per_s=1.0, model_flops_per_iteration=1.0, peak_flops_per_s=1.0, devices_for_mfu=1,
                       mfu=0.0, energy_j_per_iteration=0.0, energy_source="estimated",
                       ranks=[_rank(g, plan) for g in ranks])


PP2_DP2 = Plan(dp=2, pp=2, global_batch_size=8)


def test_a_ranks_list_that_misses_a_rank_is_refused_naming_it():
    with pytest.raises(ContractError) as e:
        _measurement(PP2_DP2, [0, 1, 3])
    assert str(e.value) == "ranks misses rank 2 of world_size=4 (a measured run has one record per rank)"
    assert e.value.key == "ranks"


def test_the_file_is_named_when_read():
    data = to_dict(_measurement(PP2_DP2, [0, 1, 2, 3]))
    data["ranks"] = [r for r in data["ranks"] if r["rank"] not in (1, 3)]
    with pytest.raises(ContractError) as e:
        from_dict(Measurement, data, "measured.json")
    assert str(e.value) == ("measured.json: ranks misses ranks 1, 3 of world_size=4 "
                            "(a measured run has one record per rank)")


def test_many_missing_ranks_are_counted_not_listed():
    plan = Plan(dp=64, global_batch_size=64)
    with pytest.raises(ContractError) as e:
        _measurement(plan, [0, 5])
    assert str(e.value) == ("ranks misses ranks 1, 2, 3, 4, 6, 7, 8, 9, … (62 in all) of world_size=64 "
                            "(a measured run has one record per rank)")


def test_every_rank_or_none_is_accepted():
    assert len(_measurement(PP2_DP2, [3, 1, 0, 2]).ranks) == 4
    assert _measurement(PP2_DP2, []).ranks == []  # a run recorded without per-rank totals
