"""Exact event replay of a supernet schedule: when every action starts and ends, and why a stage idled.

The per-stage orders of a :class:`~mindpipe.simulator.subnet_schedules.SubnetSchedule` fix
everything (BACKGROUND.md §1.3): an action starts when its stage is free and its dependencies are
done, and runs for its cost. Dependencies:

* ``F(s, b)`` needs ``F(s−1, b)`` plus the activation send from s−1 (none on the first stage), and,
  with context switching, subnet b's chosen candidates copied onto the stage. The copies run on
  their own channel per stage in the stage's forward order, each starting once the previous copy
  is done and the stage has started the previous forward (NASPipe prefetches the next subnet in
  schedule order, ``reproducible/runtime.py: context_manager``).
* ``B(s, b)`` needs ``B(s+1, b)`` plus the gradient send back (on the last stage, ``F(s, b)``).
  The gradient leaves as soon as the backward's compute ends; the stage then stays busy for the
  work after it (``after_backward_s``: the data-parallel all-reduce of the subnet's gradients and
  its optimizer update), which is when the subnet counts as *updated* on the stage.

Transfers are uncontended (priced alone by the simulator's topology and communication model); the
replay itself is deterministic and needs no event loop: each stage advances while its next action
is ready, until every action has run. A dependency that can never run is reported, not waited on.

:func:`conflict_stalls` splits each stage's idle time into CSP conflict stalls and the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mindpipe.simulator.subnet_schedules import StageOps, SubnetSchedule

PerStage = Sequence[Sequence[float]]
"""``x[s][b]``: a per-stage, per-subnet figure (seconds)."""


@dataclass(frozen=True)
class ActionCosts:
    """Durations the replay needs, per stage and subnet (``[s][b]``), and per stage boundary.

    Attributes:
        forward_s: Forward compute.
        backward_s: Backward compute (input + weight gradient).
        after_backward_s: Work right after the backward before the subnet counts as updated
            (all-reduce, optimizer step); 0 where none.
        swap_in_s: Copy of the subnet's candidates onto the stage before its forward (0 without
            context switching).
        send_forward_s: ``[s]``: activation send from stage s to s+1.
        send_backward_s: ``[s]``: gradient send from stage s to s−1.
    """

    forward_s: PerStage
    backward_s: PerStage
    after_backward_s: PerStage
    swap_in_s: PerStage
    send_forward_s: Sequence[float]
    send_backward_s: Sequence[float]


@dataclass(frozen=True)
class Replay:
    """Start and end of every action, per stage in order, and the derived times.

    Attributes:
        start_s, end_s: ``[s][k]``: the k-th action of stage s (``end`` includes ``after_backward_s``).
        forward_end_s, backward_grad_s, updated_s: ``[s][b]``: end of F; end of B's compute (when
            its gradient leaves); end of B with the work after it (the subnet updated on s).
        arrived_s: ``[s][b]``: when F(s, b)'s input was on the stage (0 on the first stage).
        makespan_s: End of the last action.
        busy_s: ``[s]``: time the stage computed (actions with the work after the backward).
    """

    start_s: list[list[float]]
    end_s: list[list[float]]
    forward_end_s: list[list[float]]
    backward_grad_s: list[list[float]]
    updated_s: list[list[float]]
    arrived_s: list[list[float]]
    makespan_s: float
    busy_s: list[float]


class ReplayDeadlock(RuntimeError):
    """The orders cannot all run: some action waits on one that never comes (a schedule bug)."""


def replay(schedule: SubnetSchedule, costs: ActionCosts) -> Replay:
    """Time every action of ``schedule`` with ``costs`` (module docstring).

    Raises:
        ReplayDeadlock: a stage's next action depends on one that cannot run.
    """
    p, n = schedule.num_stages, schedule.num_subnets
    nan = float("nan")
    f_end = [[nan] * n for _ in range(p)]
    b_grad = [[nan] * n for _ in range(p)]
    upd = [[nan] * n for _ in range(p)]
    arrived = [[0.0 if s == 0 else nan for _ in range(n)] for s in range(p)]
    start = [[0.0] * len(o) for o in schedule.orders]
    end = [[0.0] * len(o) for o in schedule.orders]
    ptr, free = [0] * p, [0.0] * p
    copy_free, last_f_start = [0.0] * p, [0.0] * p
    busy = [0.0] * p
    remaining = sum(len(o) for o in schedule.orders)
    while remaining:
        progressed = False
        for s in range(p):
            order = schedule.orders[s]
            while ptr[s] < len(order):
                a = order[ptr[s]]
                b = a.microbatch
                if a.kind == "F":
                    if s > 0 and f_end[s - 1][b] != f_end[s - 1][b]:  # NaN: not run yet
                        break
                    if s > 0:
                        arrived[s][b] = f_end[s - 1][b] + costs.send_forward_s[s - 1]
                    swap = costs.swap_in_s[s][b]
                    ready = arrived[s][b]
                    if swap > 0.0:
                        copy_free[s] = max(copy_free[s], last_f_start[s]) + swap
                        ready = max(ready, copy_free[s])
                    t0 = max(free[s], ready)
                    last_f_start[s] = t0
                    t1 = t0 + costs.forward_s[s][b]
                    f_end[s][b] = t1
                else:
                    dep = f_end[s][b] if s == p - 1 else b_grad[s + 1][b] + costs.send_backward_s[s + 1]
                    if dep != dep:
                        break
                    t0 = max(free[s], dep)
                    b_grad[s][b] = t0 + costs.backward_s[s][b]
                    t1 = b_grad[s][b] + costs.after_backward_s[s][b]
                    upd[s][b] = t1
                start[s][ptr[s]], end[s][ptr[s]] = t0, t1
                busy[s] += t1 - t0
                free[s] = t1
                ptr[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [f"stage {s}: {schedule.orders[s][ptr[s]]}" for s in range(p) if ptr[s] < len(schedule.orders[s])]
            raise ReplayDeadlock("supernet replay: no action can run; waiting are " + ", ".join(stuck))
    makespan = max((e[-1] for e in end if e), default=0.0)
    return Replay(start, end, f_end, b_grad, upd, arrived, makespan, busy)


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, cur_a, cur_b = 0.0, None, None
    for a, b in sorted(intervals):
        if cur_b is None or a > cur_b:
            if cur_b is not None and cur_a is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_a is not None and cur_b is not None:
        total += cur_b - cur_a
    return total


def conflict_stalls(schedule: SubnetSchedule, rep: Replay, ops: StageOps) -> list[float]:
    """Per stage, the idle time during which a forward was held back only by CSP's rule.

    In an idle gap ``[t0, t1)`` of stage s, subnet b counts as *conflict-held* while its input has
    arrived, its forward has not run, b lies inside the look-ahead window of the oldest subnet not
    yet updated on s at ``t0``, and an earlier subnet sharing an operator with b on s
    (:func:`~mindpipe.traces.supernet.stage_operators`) is not yet updated. The stall is the union
    of those intervals within the gaps; the rest of the idle time is waiting for data (or, in the
    other schedules, for the schedule's own order). Only ``csp`` has conflict stalls.
    """
    p, n = schedule.num_stages, schedule.num_subnets
    out = [0.0] * p
    if schedule.name != "csp":
        return out
    for s in range(p):
        f_start = [0.0] * n
        for k, a in enumerate(schedule.orders[s]):
            if a.kind == "F":
                f_start[a.microbatch] = rep.start_s[s][k]
        upd = rep.updated_s[s]
        by_update = sorted(range(n), key=lambda b: upd[b])
        oldest, done, j = 0, [False] * n, 0
        held: list[tuple[float, float]] = []
        prev_end = 0.0
        for k, t1 in enumerate(rep.start_s[s]):
            t0 = prev_end
            prev_end = rep.end_s[s][k]
            if t1 <= t0:
                continue
            while j < n and upd[by_update[j]] <= t0:  # subnets updated on s by t0
                done[by_update[j]] = True
                j += 1
            while oldest < n and done[oldest]:
                oldest += 1
            for b in range(oldest, min(n, oldest + schedule.window)):
                if f_start[b] < t1 or rep.arrived_s[s][b] >= t1:
                    continue
                blockers = [upd[w] for w in range(oldest, b) if not done[w] and ops[w][s] & ops[b][s]]
                if blockers:
                    lo, hi = max(t0, rep.arrived_s[s][b]), min(t1, max(blockers))
                    if hi > lo:
                        held.append((lo, hi))
        out[s] = _union_length(held)
    return out


__all__ = ["ActionCosts", "PerStage", "Replay", "ReplayDeadlock", "conflict_stalls", "replay"]
