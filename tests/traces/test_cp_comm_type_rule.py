"""``cp_comm_type`` says how context parallelism's ranks exchange K and V: with cp=1 there is no exchange,
so a plan may hold only the default there (which every written plan holds)."""

from __future__ import annotations

import pytest
from mindpipe.traces import config
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import from_dict, to_dict

RULE = ("cp_comm_type='p2p' needs cp > 1 (with cp=1 no rank exchanges K and V; leave cp_comm_type out or at "
        "'allgather')")


def test_a_k_v_exchange_without_context_parallelism_is_refused():
    with pytest.raises(ContractError) as e:
        Plan(cp_comm_type="p2p")
    assert str(e.value) == RULE and e.value.key == "cp_comm_type"


def test_the_refusal_names_the_file():
    with pytest.raises(ContractError) as e:
        from_dict(Plan, {"dp": 2, "global_batch_size": 4, "cp_comm_type": "p2p"}, "plan.json")
    assert str(e.value) == f"plan.json: {RULE}"


def test_the_default_stays_legal_at_cp_1_and_a_written_plan_reads_back():
    assert Plan().cp_comm_type == "allgather"
    plan = from_dict(Plan, {"cp_comm_type": "allgather"}, "plan.json")
    written = to_dict(plan)
    assert written["cp"] == 1 and written["cp_comm_type"] == "allgather"
    assert from_dict(Plan, written, "plan.json") == plan


def test_the_default_has_one_owner():
    assert Plan().cp_comm_type == config.CP_COMM_DEFAULT and config.CP_COMM_DEFAULT in config.CP_COMM_TYPES


@pytest.mark.parametrize("kind", ["allgather", "p2p"])
def test_both_exchanges_under_context_parallelism(kind):
    assert Plan(cp=2, flash_attention=True, cp_comm_type=kind).cp_comm_type == kind


def test_an_unknown_exchange_is_still_named_as_such_at_cp_1():
    with pytest.raises(ContractError, match=r"^cp_comm_type='a2a' is not one of allgather, p2p$"):
        Plan(cp_comm_type="a2a")
