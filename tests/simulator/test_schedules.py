"""Pipeline schedules: exact tables, validity over a grid, memory and bubble properties, errors."""

from __future__ import annotations

import random

import pytest
from mindpipe.simulator.actions import Action, Schedule
from mindpipe.simulator.schedules import SCHEDULE_NAMES, build_schedule, validate_schedule
from mindpipe.traces.errors import ContractError


def table(text: str) -> list[list[str]]:
    """Rows of ``"r: 0F0 0B0 …"`` lines → per-rank action strings."""
    rows = [line.split(":", 1)[1].split() for line in text.strip().splitlines()]
    return rows


def orders(s: Schedule) -> list[list[str]]:
    return [[str(a) for a in o] for o in s.orders]


# Exact tables, derived by hand from the rules in the module docstring (BACKGROUND.md §1.1).
GPIPE_3_4 = """
0: 0F0 0F1 0F2 0F3 0B0 0B1 0B2 0B3
1: 1F0 1F1 1F2 1F3 1B0 1B1 1B2 1B3
2: 2F0 2F1 2F2 2F3 2B0 2B1 2B2 2B3
"""
# warmup min(p-r-1, m) = 3, 2, 1, 0; then (F next, B oldest); then the remaining B.
ONE_F_ONE_B_4_6 = """
0: 0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0B3 0B4 0B5
1: 1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1B4 1B5
2: 2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2B5
3: 3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5
"""
# p=2, v=2, m=4: stages 0,2 on rank 0 and 1,3 on rank 1; warmup (p-r-1)*2 + (v-1)*p = 4, 2.
INTERLEAVED_2_4_2 = """
0: 0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3
1: 1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3
"""
# m == p: Megatron runs all m·v forwards first, then all backwards (last chunk first).
INTERLEAVED_2_2_2 = """
0: 0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1
1: 1F0 1F1 3F0 3F1 3B0 3B1 1B0 1B1
"""
# 1F1B's F/I skeleton; rank r defers r weight passes, then runs the oldest W after each I.
ZB_H1_4_6 = """
0: 0F0 0F1 0F2 0F3 0I0 0W0 0F4 0I1 0W1 0F5 0I2 0W2 0I3 0W3 0I4 0W4 0I5 0W5
1: 1F0 1F1 1F2 1I0 1F3 1I1 1W0 1F4 1I2 1W1 1F5 1I3 1W2 1I4 1W3 1I5 1W4 1W5
2: 2F0 2F1 2I0 2F2 2I1 2F3 2I2 2W0 2F4 2I3 2W1 2F5 2I4 2W2 2I5 2W3 2W4 2W5
3: 3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3F4 3I4 3W1 3F5 3I5 3W2 3W3 3W4 3W5
"""
# V placement: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2 (Qi et al. §6).
ZBV_2_4 = """
0: 0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 0I2 0W2 0I3 0W3
1: 1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 1I3 1W2 2W3 1W3
"""
# DualPipeV's eight steps; each fused (F & B) pair is listed F then B.
DUALPIPEV_2_4 = """
0: 0F0 0F1 0F2 3F0 3I0 3W0 3F1 0F3 3B1 3F2 0B0 3B2 3F3 0B1 3B3 0I2 0W2 0I3 0W3
1: 1F0 2F0 1F1 2F1 1F2 2B0 2F2 1B0 1F3 2B1 2F3 1B1 2B2 1B2 2I3 1I3 2W3 1W3
"""


@pytest.mark.parametrize(
    ("name", "pp", "m", "v", "expected", "placement"),
    [
        ("gpipe", 3, 4, 1, GPIPE_3_4, [0, 1, 2]),
        ("1f1b", 4, 6, 1, ONE_F_ONE_B_4_6, [0, 1, 2, 3]),
        ("interleaved_1f1b", 2, 4, 2, INTERLEAVED_2_4_2, [0, 1, 0, 1]),
        ("interleaved_1f1b", 2, 2, 2, INTERLEAVED_2_2_2, [0, 1, 0, 1]),
        ("zb_h1", 4, 6, 1, ZB_H1_4_6, [0, 1, 2, 3]),
        ("zbv", 2, 4, 2, ZBV_2_4, [0, 1, 1, 0]),
        ("dualpipev", 2, 4, 2, DUALPIPEV_2_4, [0, 1, 1, 0]),
    ],
)
def test_exact_tables(name, pp, m, v, expected, placement):
    s = build_schedule(name, pp, m, v)
    assert orders(s) == table(expected)
    assert s.stage_to_rank == placement
    assert (s.name, s.pp, s.num_microbatches, s.num_stages) == (name, pp, m, pp * v)
    validate_schedule(s)


def grid():
    for pp in range(1, 6):
        for m in range(1, 11):
            yield "gpipe", pp, m, 1
            yield "1f1b", pp, m, 1
            yield "zb_h1", pp, m, 1
            yield "zbv", pp, m, 2
            if m >= 2 * pp:
                yield "dualpipev", pp, m, 2
            if m % pp == 0:
                for v in (1, 2, 3):
                    yield "interleaved_1f1b", pp, m, v


GRID = list(grid())


@pytest.mark.parametrize(("name", "pp", "m", "v"), GRID)
def test_grid_valid_and_counts(name, pp, m, v):
    s = build_schedule(name, pp, m, v)
    validate_schedule(s)
    per_stage = 2 if name in ("gpipe", "1f1b", "interleaved_1f1b") else None
    for r, order in enumerate(s.orders):
        stages = s.stages_of_rank(r)
        assert len(stages) == v
        assert sum(a.kind == "F" for a in order) == v * m
        if per_stage is not None:
            assert len(order) == per_stage * v * m
        else:
            n_b = sum(a.kind == "B" for a in order)
            n_i = sum(a.kind == "I" for a in order)
            assert sum(a.kind == "W" for a in order) == n_i
            assert n_b + n_i == v * m
            assert len(order) == v * m + n_b + 2 * n_i
            if name != "dualpipev":
                assert n_b == 0


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 12])
def test_in_flight_peaks(pp, m):
    one = build_schedule("1f1b", pp, m).rank_in_flight_peak()
    assert one == [min(pp - r, m) for r in range(pp)]
    assert build_schedule("gpipe", pp, m).rank_in_flight_peak() == [m] * pp
    zb = build_schedule("zb_h1", pp, m)
    # Qi et al. (§3) count ZB-H1 at 1F1B's memory, as if I freed what W does not need: that is the
    # count of micro-batches awaiting their input gradient.
    awaiting_input = [max(sum(h.awaiting_input for h in t.values()) for t in zb.held_timeline(r)) for r in range(pp)]
    assert awaiting_input == one
    # torch's I keeps the graph for W (retain_graph), so activations are held until W, and W's
    # deferred by p − 1 − r slots keep every rank at the first rank's count (changed in issue 16:
    # the executor's measured memory of the zb_h1 last stage was above the I-release count).
    assert zb.rank_in_flight_peak() == [min(pp, m)] * pp


@pytest.mark.parametrize(("pp", "m", "v"), [(2, 2, 2), (2, 4, 2), (3, 6, 2), (4, 8, 2), (4, 4, 3), (4, 12, 3), (3, 9, 1)])
def test_interleaved_in_flight_is_warmup_plus_one(pp, m, v):
    peaks = build_schedule("interleaved_1f1b", pp, m, v).rank_in_flight_peak()
    for r in range(pp):
        warm = m * v if m == pp else min((pp - r - 1) * 2 + (v - 1) * pp, m * v)
        assert peaks[r] == min(warm + 1, m * v)


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 6])
def test_v_schedule_memory(pp):
    # ZB-V: every rank peaks at 2p chunk activations = p full-stage units, 1F1B's first-rank peak.
    for m in (2 * pp - 1, 2 * pp, 3 * pp + 1):
        assert build_schedule("zbv", pp, m, 2).rank_in_flight_peak() == [2 * pp] * pp
    # DualPipeV: PP+1 chunk activations with PP = 2p stages (DualPipe README; BACKGROUND.md §1.2).
    for m in (2 * pp, 4 * pp):
        assert build_schedule("dualpipev", pp, m, 2).rank_in_flight_peak() == [2 * pp + 1] * pp


def makespan(s: Schedule, dur: dict[str, float]) -> float:
    """Replay with fixed per-kind durations and free communication (BACKGROUND.md §1.3)."""
    end: dict[tuple[int, str, int], float] = {}
    free = [0.0] * s.pp
    pos = [0] * s.pp
    last = s.num_stages - 1

    def deps(a: Action) -> list[tuple[int, str, int]]:
        if a.kind == "F":
            return [(a.stage - 1, "F", a.microbatch)] if a.stage > 0 else []
        if a.kind == "W":
            return [(a.stage, "I", a.microbatch)]
        return [(a.stage, "F", a.microbatch)] + ([(a.stage + 1, "I", a.microbatch)] if a.stage < last else [])

    moved = True
    while moved:
        moved = False
        for r, order in enumerate(s.orders):
            while pos[r] < len(order) and all(d in end for d in deps(order[pos[r]])):
                a = order[pos[r]]
                t = max([free[r]] + [end[d] for d in deps(a)]) + dur[a.kind]
                end[(a.stage, "I" if a.kind == "B" else a.kind, a.microbatch)] = free[r] = t
                pos[r] += 1
                moved = True
    assert all(pos[r] == len(o) for r, o in enumerate(s.orders))
    return max(free)


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_bubbles_match_closed_forms(pp, k):
    m = k * pp
    # GPipe and 1F1B: (m + p - 1)(t_f + t_b) (BACKGROUND.md §1.2).
    assert makespan(build_schedule("gpipe", pp, m), {"F": 1, "B": 2}) == 3 * (m + pp - 1)
    assert makespan(build_schedule("1f1b", pp, m), {"F": 1, "B": 2}) == 3 * (m + pp - 1)
    # ZB-H1: bubble (p-1)(T_F + T_B - T_W) (Qi et al. §3), equal and unequal pass times.
    assert makespan(build_schedule("zb_h1", pp, m), {"F": 1, "I": 1, "W": 1}) == 3 * m + (pp - 1)
    assert makespan(build_schedule("zb_h1", pp, m), {"F": 2, "I": 2, "W": 1}) == 5 * m + 3 * (pp - 1)
    # Interleaved, chunk times t/v: bubble (p-1)(t_f + t_b)/v (Narayanan et al. §2.2.2).
    for v in (2, 3):
        assert makespan(build_schedule("interleaved_1f1b", pp, m, v), {"F": 1, "B": 2}) == 3 * m * v + 3 * (pp - 1)
    # ZB-V with T_F = T_B = T_W per chunk: only the p-1 start-up steps the last rank must wait
    # for, the least any order can reach (6m units of work per rank).
    if m >= 2 * pp - 1:
        assert makespan(build_schedule("zbv", pp, m, 2), {"F": 1, "I": 1, "W": 1}) == 6 * m + pp - 1


def test_build_is_fresh_and_cached_lists_are_not_shared():
    s = build_schedule("1f1b", 4, 8)
    s.orders[0].clear()
    assert len(build_schedule("1f1b", 4, 8).orders[0]) == 16


def test_large_build_is_complete():
    # Sizes the simulator uses (pp=16, m=128); correctness only, no timing.
    s = build_schedule("1f1b", 16, 128)
    assert [len(o) for o in s.orders] == [256] * 16
    assert s.rank_in_flight_peak() == [16 - r for r in range(16)]


@pytest.mark.parametrize(
    ("args", "key", "rule"),
    [
        (("pipedream", 2, 4, 1), "schedule", "is not one of"),
        (("1f1b", 0, 4, 1), "pp", "pp=0 must be >= 1"),
        (("1f1b", 2, 0, 1), "num_microbatches", "num_microbatches=0 must be >= 1"),
        (("interleaved_1f1b", 2, 4, 0), "virtual_stages", "virtual_stages=0 must be >= 1"),
        (("1f1b", 2, 4, 2), "virtual_stages", "needs virtual_stages=1"),
        (("gpipe", 2, 4, 2), "virtual_stages", "needs virtual_stages=1"),
        (("zb_h1", 2, 4, 2), "virtual_stages", "needs virtual_stages=1"),
        (("zbv", 2, 4, 1), "virtual_stages", "needs virtual_stages=2"),
        (("dualpipev", 2, 8, 3), "virtual_stages", "needs virtual_stages=2"),
        (("interleaved_1f1b", 4, 6, 2), "num_microbatches", "multiple of pp=4"),
        (("dualpipev", 4, 7, 2), "num_microbatches", ">= 2·pp=8"),
    ],
)
def test_bad_arguments_raise_contract_errors(args, key, rule):
    with pytest.raises(ContractError) as e:
        build_schedule(*args)
    assert e.value.source == "plan"
    assert e.value.key == key
    assert rule in e.value.rule


def custom(name: str, pp: int, m: int, rows: str, placement: list[int] | None = None) -> Schedule:
    orders_ = [[Action.parse(t) for t in row] for row in table(rows)]
    n_st = max(a.stage for o in orders_ for a in o) + 1
    return Schedule(name, pp, m, n_st, placement or list(range(n_st)), orders_)


def test_validate_reports_deadlock_with_rank_action_and_dependency():
    s = custom("bad", 2, 2, """
        0: 0F0 0B0 0F1 0B1
        1: 1F1 1F0 1B0 1B1
    """)
    with pytest.raises(ValueError) as e:
        validate_schedule(s)
    msg = str(e.value)
    assert "deadlock" in msg
    assert "rank 0 is stuck at 0B0 (position 1), waiting for B/I(1,0) on rank 1" in msg
    assert "rank 1 is stuck at 1F1 (position 0), waiting for F(0,1) on rank 0" in msg


def test_validate_reports_weight_before_input_grad():
    s = custom("bad", 1, 1, "0: 0F0 0W0 0I0")
    with pytest.raises(ValueError, match=r"rank 0 is stuck at 0W0 \(position 1\), waiting for I\(0,0\) on rank 0"):
        validate_schedule(s)


@pytest.mark.parametrize(
    ("rows", "placement", "match"),
    [
        ("0: 0F0 0B0\n1: 1F0", None, r"stage 1 micro-batch 0 on rank 1 has F; needs F and either B or I and W"),
        ("0: 0F0 0B0 0B0\n1: 1F0 1B0", None, r"rank 0 runs 0B0 twice"),
        ("0: 0F0 0B0 1F0\n1: 1B0", None, r"rank 0 runs 1F0 but stage 1 is on rank 1"),
        ("0: 0F0 0I0 0W0\n1: 1F0 1I0", None, r"stage 1 micro-batch 0 on rank 1 has FI;"),
        ("0: 0F0 0I0 0W0 0B0\n1: 1F0 1B0", None, r"stage 0 micro-batch 0 on rank 0 has BFIW;"),
        ("0: 0F0 0B0 0F1 0B1\n1: 1F0 1B0", None, r"rank 0 runs 0F1 outside 2 stages × 1 micro-batches"),
    ],
)
def test_validate_reports_incomplete_or_misplaced(rows, placement, match):
    s = custom("bad", 2, 1, rows, placement)
    with pytest.raises(ValueError, match=match):
        validate_schedule(s)


def test_all_names_are_buildable():
    built = {build_schedule(n, 2, 4, 2 if n in ("zbv", "dualpipev", "interleaved_1f1b") else 1).name
             for n in SCHEDULE_NAMES}
    assert built == set(SCHEDULE_NAMES)


@pytest.mark.parametrize(("name", "pp", "m", "v"), [
    ("gpipe", 4, 32, 1), ("1f1b", 8, 64, 1), ("1f1b", 4, 4, 1), ("interleaved_1f1b", 4, 16, 3),
    ("zb_h1", 4, 12, 1), ("zbv", 4, 8, 2), ("dualpipev", 4, 8, 2)])
def test_held_states_hold_every_peak_of_the_timeline(name, pp, m, v):
    """The memory checks evaluate held_states instead of the whole timeline: for any bytes that are
    non-negative per micro-batch awaiting its input, per gradient and per backward coming next (and
    of either sign per micro-batch awaiting W), both have the same peak."""
    sched = build_schedule(name, pp, m, v)
    rng = random.Random(f"{name}{pp}{m}{v}")
    for r in range(pp):
        timeline, states = sched.held_timeline(r), sched.held_states(r)
        distinct = [h for i, h in enumerate(timeline) if h not in timeline[:i]]
        assert states == [h for h in distinct if h in states]  # distinct entries, first-seen order
        # what makes the memory checks m/pp times cheaper: a bound independent of m (a backward's
        # kind and what is prefetched beside it, Held.next_*, make up to 3·pp·v distinct entries)
        assert len(states) <= 3 * pp * v
        for _ in range(50):
            a = {s: rng.random() for s in timeline[0]}
            w = {s: rng.uniform(-1, 1) for s in timeline[0]}
            g = {s: rng.random() for s in timeline[0]}
            # a transient per backward coming next: its stage, kind, prefetched sets and the stage
            # prefetched beside it
            contexts = {(s, x.next_kind, x.next_sets, x.next_across) for h in timeline for s, x in h.items()}
            t = {c: rng.random() for c in contexts}
            whole = {s: rng.random() for s in timeline[0]}  # whole gradients weigh more than reduced ones
            # before a forward its gathered layers (no more than any backward's), at the step's end nothing
            gathered = rng.random() * min(t.values())

            def total(h, a=a, w=w, g=g, t=t, whole=whole, gathered=gathered):
                idle = not any(x.backward_next for x in h.values())
                return sum(x.awaiting_input * a[s] + x.awaiting_weight * w[s] + x.has_grads * g[s]
                           + (x.has_grads and not x.grads_reduced) * whole[s]
                           + x.backward_next * t[s, x.next_kind, x.next_sets, x.next_across]
                           for s, x in h.items()) + idle * (0.0 if next(iter(h.values())).step_done else gathered)
            assert max(map(total, states)) == max(map(total, timeline))


def test_prefetch_rule_names_the_backward_after_another_action():
    """vPipe's prefetch: a backward's swapped activations come back under the action before it,
    unless that is its own forward (one rule: the engine, the memory model and the executor)."""
    from mindpipe.simulator.actions import prefetched_backward

    s = build_schedule("1f1b", 4, 8)
    first, last = s.orders[0], s.orders[3]
    assert [str(a) for a in first[:6]] == ["0F0", "0F1", "0F2", "0F3", "0B0", "0F4"]
    assert prefetched_backward(first, 3) == Action(0, "B", 0)  # under F3
    assert prefetched_backward(first, 4) is None  # F4 is next
    assert prefetched_backward(last, 0) is None  # the last stage's B0 follows its own F0
    # 1F1B: one micro-batch's copies back under a forward; two in the cool-down (B under B).
    assert [s.prefetched_sets(i) for i in range(4)] == [2, 2, 2, 0]
    assert [s.round_trip_share(i) for i in range(4)] == [0.0, 0.0, 0.0, 1.0]
    # One micro-batch: every backward follows its own forward, nothing is prefetched.
    one = build_schedule("1f1b", 4, 1)
    assert [one.prefetched_sets(i) for i in range(4)] == [0, 0, 0, 0]


@pytest.mark.parametrize(("name", "pp", "m", "v"), [("gpipe", 1, 2, 1), ("1f1b", 4, 8, 1), ("zbv", 2, 4, 2)])
def test_only_the_point_after_the_last_action_is_the_steps_end(name, pp, m, v):
    """After a rank's last action nothing runs until the optimizer step, so the memory model counts
    no gathered layer there (ZeRO-3 without pipelining gathers one for each forward and backward);
    every other point has a forward or a backward next."""
    sched = build_schedule(name, pp, m, v)
    for r in range(pp):
        timeline = sched.held_timeline(r)
        assert all(x.step_done for x in timeline[-1].values())
        assert not any(x.step_done for h in timeline[:-1] for x in h.values())
        assert all(any(x.backward_next for x in h.values()) or sched.orders[r][i + 1].kind == "F"
                   for i, h in enumerate(timeline[:-1]))
