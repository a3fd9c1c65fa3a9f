"""The fluid link-sharing model: max-min fairness, caps, multiplicities and priority classes."""

from __future__ import annotations

import pytest
import simpy
from mindpipe.simulator.network import FluidNetwork, solo_times
from mindpipe.simulator.topology import FlowSpec, Phase


def _run(flows: list[tuple[tuple, tuple, float, float, int, float]], capacity: dict) -> list[float]:
    """Start each flow (links, mult, size, cap, prio, start_time); return completion times."""
    env = simpy.Environment()
    net = FluidNetwork(env, capacity.__getitem__)
    done = [0.0] * len(flows)

    def starter(i: int, spec):
        links, mult, size, cap, prio, t0 = spec
        yield env.timeout(t0)

        def fin() -> None:
            done[i] = env.now

        net.start(links, mult, size, cap, prio, fin)

    for i, spec in enumerate(flows):
        env.process(starter(i, spec))
    env.run()
    return done


def test_single_flow_runs_at_link_capacity_or_its_cap() -> None:
    cap = {"a": 10.0}
    assert _run([(("a",), (1,), 100.0, 1e9, 0, 0.0)], cap) == [pytest.approx(10.0)]
    assert _run([(("a",), (1,), 100.0, 4.0, 0, 0.0)], cap) == [pytest.approx(25.0)]


def test_two_flows_share_a_link_equally_then_the_survivor_speeds_up() -> None:
    # 100 and 50 units on a 10/s link: both at 5/s until t=10 (50 done), then 50 left at 10/s.
    t = _run([(("a",), (1,), 100.0, 1e9, 0, 0.0), (("a",), (1,), 50.0, 1e9, 0, 0.0)], {"a": 10.0})
    assert t == [pytest.approx(15.0), pytest.approx(10.0)]


def test_late_arrival_slows_an_ongoing_flow() -> None:
    # Flow 0 alone for 5 s (50 units), then shares: 50 left at 5/s -> ends at 15; flow 1 (50) ends at 15 too.
    t = _run([(("a",), (1,), 100.0, 1e9, 0, 0.0), (("a",), (1,), 50.0, 1e9, 0, 5.0)], {"a": 10.0})
    assert t == [pytest.approx(15.0), pytest.approx(15.0)]


def test_multiplicity_counts_identical_replica_flows() -> None:
    # A flow standing for 3 replicas plus one single flow: 4 shares of a 12/s link -> 3/s each.
    t = _run([(("a",), (3,), 30.0, 1e9, 0, 0.0), (("a",), (1,), 30.0, 1e9, 0, 0.0)], {"a": 12.0})
    assert t == [pytest.approx(10.0), pytest.approx(10.0)]


def test_max_min_fairness_across_two_links() -> None:
    # f0 on a (cap 10) and b (cap 4); f1 on a only. b limits f0 to 4, so f1 gets the remaining 6.
    t = _run([(("a", "b"), (1, 1), 40.0, 1e9, 0, 0.0), (("a",), (1,), 60.0, 1e9, 0, 0.0)], {"a": 10.0, "b": 4.0})
    assert t == [pytest.approx(10.0), pytest.approx(10.0)]


def test_priority_class_is_served_first() -> None:
    # High priority (0) takes the whole link; the low-priority flow waits, then runs alone.
    t = _run([(("a",), (1,), 50.0, 1e9, 1, 0.0), (("a",), (1,), 50.0, 1e9, 0, 0.0)], {"a": 10.0})
    assert t == [pytest.approx(10.0), pytest.approx(5.0)]


def test_capped_high_priority_flow_leaves_the_rest_to_others() -> None:
    # Priority flow capped at 4/s; the other gets 6/s of the 10/s link.
    t = _run([(("a",), (1,), 40.0, 4.0, 0, 0.0), (("a",), (1,), 60.0, 1e9, 1, 0.0)], {"a": 10.0})
    assert t == [pytest.approx(10.0), pytest.approx(10.0)]


def _phase(*flows: tuple[tuple, ...]) -> Phase:
    """A phase whose flows cross the given link tuples (1 byte each, multiplicity 1)."""
    return Phase("allreduce", 2, "nvlink", tuple(FlowSpec(links, 1.0, (1,) * len(links), "nvlink") for links in flows))


def test_solo_times_only_for_lists_whose_links_nobody_else_crosses() -> None:
    a, b, c = ("nvout", 0), ("nvin", 1), ("nvout", 2)
    owned = [
        (0, [_phase((a, b))]),  # rank 0's forward TP: its links are rank 0's alone
        (0, [_phase((a, b)), _phase((a,))]),  # rank 0's backward TP: same owner, run one at a time
        (1, [_phase((c,))]),  # rank 1's, but a send crosses c
        (2, [_phase((("nvout", 5),), (("nvout", 5),))]),  # two flows of one phase on one link
        (3, []),  # no collectives: trivially alone
    ]
    shared = [[_phase((c, ("nvin", 3)))]]
    got = solo_times(owned, shared, lambda phases: 10.0 * len(phases))
    assert got == [10.0, 20.0, None, None, 0.0]


def test_solo_times_none_when_two_owners_share_a_link() -> None:
    link = ("local", 0)
    got = solo_times([(0, [_phase((link,))]), (1, [_phase((link,))])], [], lambda phases: 1.0)
    assert got == [None, None]
