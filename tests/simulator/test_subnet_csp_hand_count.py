"""CSP against a hand count: supernet-mini's first six subnets on two stages of four layers.

Choice vectors (sampler seed 0), layers 0-3 | 4-7::

    0: 5 3 3 1 | 1 0 0 0        3: 3 5 5 5 | 4 1 3 1
    1: 3 5 5 3 | 1 4 1 5        4: 2 5 2 1 | 4 2 3 2
    2: 5 0 1 2 | 1 3 5 0        5: 4 2 4 3 | 2 2 1 2

Pairs sharing a candidate (same index in the same layer): stage 0 — (0,2) L0, (1,3) L0, (0,4) L3,
(1,4) L1, (3,4) L1, (1,5) L3; stage 1 — (0,1) (0,2) (1,2) L4, (3,4) L4, (1,5) L6, (4,5) L5.
Consecutive pairs conflicting: stage 0 only (3,4), 1 of 5 = 20 %; stage 1 (0,1) (1,2) (3,4) (4,5),
4 of 5 = 80 %.

List scheduling with forward 1, backward 2, free sends and updates, window 4 (2·pp), backward first:
stage 0 runs F0 F1, then holds F2 (needs B0: shares L0 with 0) and F3 (needs B1) from t = 2 to 4
(2 units of conflict stall); after B2 at t = 12 it skips F4 (shares L1 with 3, not yet updated) and
runs F5. Stage 1 has F5 at t = 13 but F4 (which it conflicts with on L5) only at t = 16: 3 units of
conflict stall. Makespan 24, each stage busy 6 × (1 + 2) = 18.
"""

from __future__ import annotations

from mindpipe.simulator.subnet_replay import ActionCosts, conflict_stalls, replay
from mindpipe.simulator.subnet_schedules import build_subnet_schedule, consecutive_conflict_rate, csp_violations
from mindpipe.traces.builtin import load_supernet
from mindpipe.traces.config import Plan
from mindpipe.traces.supernet import sample_subnets, subnet_stage_operators

NET = load_supernet("supernet-mini")
CHOICES = [(5, 3, 3, 1, 1, 0, 0, 0), (3, 5, 5, 3, 1, 4, 1, 5), (5, 0, 1, 2, 1, 3, 5, 0),
           (3, 5, 5, 5, 4, 1, 3, 1), (2, 5, 2, 1, 4, 2, 3, 2), (4, 2, 4, 3, 2, 2, 1, 2)]


def test_csp_order_stalls_and_rates_match_the_hand_count() -> None:
    assert sample_subnets(NET, 6) == CHOICES
    plan = Plan(pp=2, micro_batch_size=1, global_batch_size=1)
    ops = [subnet_stage_operators(NET, plan, c) for c in CHOICES]
    sched = build_subnet_schedule("csp", ops, 2, window=4)
    text = [" ".join(f"{a.kind}{a.microbatch}" for a in o) for o in sched.orders]
    assert text == ["F0 F1 B0 F2 B1 F3 B2 F5 B3 F4 B4 B5", "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"]
    assert csp_violations(sched, ops) == []
    n = len(CHOICES)
    rep = replay(sched, ActionCosts([[1.0] * n] * 2, [[2.0] * n] * 2, [[0.0] * n] * 2, [[0.0] * n] * 2,
                                    [0.0, 0.0], [0.0, 0.0]))
    assert rep.makespan_s == 24.0 and rep.busy_s == [18.0, 18.0]
    assert conflict_stalls(sched, rep, ops) == [2.0, 3.0]
    assert [consecutive_conflict_rate(ops, s) for s in (0, 1)] == [0.2, 0.8]
